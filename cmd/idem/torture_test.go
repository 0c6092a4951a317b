package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemtest"
)

// tortureChildEnv makes this test binary run as idem itself: `idem torture`
// starts its replicas from os.Executable(), which in a test is the test
// binary.
const tortureChildEnv = "IDEM_TORTURE_TEST_CHILD"

func init() {
	if os.Getenv(tortureChildEnv) == "1" {
		main() // exits
	}
	// Set before any test runs, so every replica a test starts inherits it.
	os.Setenv(tortureChildEnv, "1")
}

// tortureSeedEnv replays a torture test's plan: the seed its failure
// printed, given here, makes the same choices (payments, drops, kills, the
// scheduled store faults) again, not the machine's timing
// (torture.SeedReplays).
const tortureSeedEnv = "IDEM_TORTURE_SEED"

// seedArgs returns --seed and the seed of the test's run: tortureSeedEnv's
// when set, a random one otherwise. It logs the seed and how to replay it
// before the run starts, so that a test that fails in any way names it: a
// check that fails, a run that aborts (a consumer that never says it is
// ready), a t.Fatal, and a test stopped by go test's -timeout too. Under
// -v and -json (as scripts/test runs) the log line is printed at once; for
// a plain go test, whose logs a timeout's panic never prints, the seed is
// also written to stderr just before the test binary's deadline, should
// the test still be running then.
func seedArgs(t *testing.T) []string {
	t.Helper()
	if seed, ok := testSeeds.Load(t); ok {
		// A test of many short runs (the usage tests) is logged once.
		return []string{"--seed", strconv.FormatUint(seed.(uint64), 10)}
	}
	seed := uint64(0)
	if s := os.Getenv(tortureSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("%s=%q: want a run's seed, a positive number", tortureSeedEnv, s)
		}
		seed = n
	} else {
		seed = rand.Uint64() | 1
	}
	testSeeds.Store(t, seed)
	t.Cleanup(func() { testSeeds.Delete(t) })
	replay := seedReplay(t.Name(), seed)
	t.Logf("seed %d: %s", seed, replay)
	if deadline, ok := t.Deadline(); ok && !testing.Verbose() {
		warn := time.AfterFunc(time.Until(deadline)-5*time.Second, func() {
			fmt.Fprintf(os.Stderr, "%s is still running at the test binary's deadline; its seed %d: %s\n", t.Name(), seed, replay)
		})
		t.Cleanup(func() { warn.Stop() })
	}
	return []string{"--seed", strconv.FormatUint(seed, 10)}
}

// testSeeds are the seeds of the tests running, by *testing.T.
var testSeeds sync.Map

// seedReplay is the command that runs test (and, for a subtest, none of
// its siblings) again with seed, and what that replays.
func seedReplay(test string, seed uint64) string {
	parts := strings.Split(test, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return fmt.Sprintf("the same plan and scheduled faults (not the machine's timing) with %s=%d go test -run '%s' ./cmd/idem", tortureSeedEnv, seed, strings.Join(parts, "/"))
}

// runTorture runs `idem torture requests` with args and returns its exit
// status, its output and its RESULT figures by metric. The seed is
// tortureSeedEnv's when set, and is logged before the run (seedArgs).
func runTorture(t *testing.T, args ...string) (code int, stdout, stderr string, results map[string]int64) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, seedArgs(t)...)
	logs := keepLogs(t)
	args = append(args, "--replica-log", filepath.Join(logs, "replicas.log"))
	code = run(t.Context(), append([]string{"torture", "requests"}, args...), &out, &errOut)
	writeDriverLog(t, logs, args, out.String(), errOut.String())
	results = map[string]int64{}
	for line := range strings.Lines(out.String()) {
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) != 5 || f[0] != "RESULT" || !strings.HasPrefix(f[1], "torture-requests-") {
			continue
		}
		if n, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			results[f[2]] = n
		}
	}
	return code, out.String(), errOut.String(), results
}

// keepLogs returns the directory where a torture test keeps the evidence
// of one run: every replica's log (--replica-log) and the driver's output
// (writeDriverLog). It is a directory of its own, one per run (a test may
// run several, as TestTortureRequestsUsage does, and each run's evidence
// must survive the next), under the test's artifact directory with
// -artifacts (as scripts/test runs, into .artifacts), under the temporary
// directory otherwise, where it outlives the test. A test that passes
// removes what it wrote there; one that fails keeps it and logs where it
// is.
func keepLogs(t *testing.T) string {
	t.Helper()
	parent, name := "", "idem-"+strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+"-"
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		parent, name = t.ArtifactDir(), "run-"
	}
	dir, err := os.MkdirTemp(parent, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the replicas' logs and the driver's output of this run are kept in %s", dir)
			if b, err := os.ReadFile(filepath.Join(dir, "replicas.log")); err == nil {
				if dumps := writerWatchdogDumps(string(b), maxDumpLines); dumps != "" {
					t.Logf("what held a replica's SQLite writer (its writer watchdog's goroutine dumps, from replicas.log):\n%s", dumps)
				}
			}
			return
		}
		for _, f := range []string{"replicas.log", "driver.log"} {
			os.Remove(filepath.Join(dir, f))
		}
		os.Remove(dir) // only when empty
		if parent != "" {
			os.Remove(parent) // only when empty: the artifact directory may hold more
		}
	})
	return dir
}

// maxDumpLines bounds the lines of writer watchdog dumps a failed torture
// test prints: the log keeps them all.
const maxDumpLines = 1500

// writerWatchdogDumps returns, from a run's replicas.log, the lines of the
// replicas' SQLite writer watchdogs (serve's $IDEM_SQLITE_WRITER_WATCHDOG,
// which the torture sets): each record that a transaction held a writer
// past the limit, and the goroutine stacks that follow it, up to max lines
// in all; "" when there are none.
func writerWatchdogDumps(log string, max int) string {
	var b strings.Builder
	n := 0
	in := map[string]bool{} // the replicas whose dump is being read
	for line := range strings.Lines(log) {
		name, text, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		switch {
		case strings.Contains(text, "sqlite writer watchdog: goroutines"):
			in[name] = true
		case strings.Contains(text, "sqlite writer watchdog: end of the goroutines"):
			in[name] = false
		case !in[name] && !strings.Contains(text, "sqlite writer watchdog"):
			continue
		}
		if n == max {
			b.WriteString("… (the rest is in replicas.log)\n")
			break
		}
		b.WriteString(line)
		n++
	}
	return b.String()
}

// writeDriverLog writes the torture driver's stdout and stderr to dir.
func writeDriverLog(t *testing.T, dir string, args []string, stdout, stderr string) {
	t.Helper()
	text := fmt.Sprintf("args: %q\nstdout:\n%s\nstderr:\n%s", args, stdout, stderr)
	if err := os.WriteFile(filepath.Join(dir, "driver.log"), []byte(text), 0o644); err != nil {
		t.Errorf("keeping the driver's output: %v", err)
	}
}

// resultText is the value of the RESULT line of metric in a run's stdout,
// as printed ("" when there is none): for figures that are not integers.
func resultText(stdout, metric string) string {
	for line := range strings.Lines(stdout) {
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) == 5 && f[0] == "RESULT" && f[2] == metric {
			return f[3]
		}
	}
	return ""
}

// checkHeld fails the test unless the run held the promise under faults:
// one payment per logical payment, as much money taken as owed, answers
// lost and replicas killed on the way.
func checkHeld(t *testing.T, payments int64, code int, stdout, stderr string, r map[string]int64) {
	t.Helper()
	checkHeldDups(t, payments, 8, code, stdout, stderr, r)
}

// checkHeldDups is checkHeld for a run of dups attempts per payment.
func checkHeldDups(t *testing.T, payments, dups int64, code int, stdout, stderr string, r map[string]int64) {
	t.Helper()
	if code != exitOK {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if r["logical_payments"] != payments || r["payments"] != payments || r["answered"] != payments {
		t.Errorf("logical payments %d, payments %d, answered %d; want %d each", r["logical_payments"], r["payments"], r["answered"], payments)
	}
	if r["money_taken"] != r["money_owed"] || r["money_taken_api"] != r["money_owed"] || r["money_owed"] == 0 {
		t.Errorf("money taken %d (database) and %d (API), owed %d", r["money_taken"], r["money_taken_api"], r["money_owed"])
	}
	if r["attempts"] < payments*dups || r["lost_responses"] == 0 || r["kills"] == 0 {
		t.Errorf("attempts %d, lost responses %d, kills %d: the run did not torture much", r["attempts"], r["lost_responses"], r["kills"])
	}
	if r["violations"] != 0 || !strings.Contains(stdout, "promise: HELD") {
		t.Errorf("violations %d\n%s", r["violations"], stdout)
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

func TestTortureRequestsSQLite(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--payments", "400", "--kill-every", "300ms", "--timeout", "90s")
	checkHeld(t, 400, code, stdout, stderr, r)
	if !strings.Contains(stdout, "RESULT,torture-requests-sqlite,") {
		t.Errorf("no RESULT lines named torture-requests-sqlite:\n%s", stdout)
	}
}

func TestTortureRequestsPostgres(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	code, stdout, stderr, r := runTorture(t, "--db", url, "--payments", "400", "--kill-every", "300ms", "--timeout", "90s")
	checkHeld(t, 400, code, stdout, stderr, r)
	if !strings.Contains(stdout, "RESULT,torture-requests-pg,") {
		t.Errorf("no RESULT lines named torture-requests-pg:\n%s", stdout)
	}
	if strings.Contains(stdout+stderr, "postgres://") {
		t.Errorf("the output names the database URL:\n%s\n%s", stdout, stderr)
	}
}

// A card network between the payments and their money, refusing and
// dropping a share of its answers, and replicas that SIGKILL themselves
// between the network's charge and the payment's commit, besides the
// usual lost answers and kills: still one charge per logical payment, the
// one its payment records. (idem torture requests --acquirer private
// --payments 10000 is the long form.)
func TestTortureRequestsAcquirer(t *testing.T) {
	t.Parallel()
	for name, db := range map[string][]string{"sqlite": nil, "postgres": {"--db", postgresURL(t)}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := append(db, "--acquirer", "private", "--payments", "1000", "--dups", "2", "--crash-after-charge", "0.05", "--clients", "32",
				"--kill-every", "500ms", "--timeout", "300s")
			code, stdout, stderr, r := runTorture(t, args...)
			checkHeldDups(t, 1000, 2, code, stdout, stderr, r)
			if d, ok := r["reconcile_differences"]; !ok || d != 0 {
				t.Errorf("idem reconcile: ran %v, %d differences; want it run, with none", ok, d)
			}
			t.Logf("%d crashes after a charge, %d charges", r["crashes_after_charge"], r["charges"])
			if r["charges"] != 1000 || r["crashes_after_charge"] == 0 {
				t.Errorf("%d charges, %d crashes after a charge; want 1000 charges, crashes on the way\n%s", r["charges"], r["crashes_after_charge"], stdout)
			}
		})
	}
}

// A run of a single payment with an acquirer meets the crash after a
// charge it owes: the order is placed before that payment is handed to
// the clients, so its one first try carries it (nothing else in the run
// to keep the try from its charge: no kills, drops, or network faults).
func TestTortureRequestsOnePaymentOwesACrash(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--acquirer", "private", "--acquirer-fault-rate", "-1", "--drop", "0", "--kill-every", "0",
		"--payments", "1", "--dups", "1", "--timeout", "30s")
	if code != exitOK || r["violations"] != 0 || r["crashes_after_charge"] == 0 {
		t.Fatalf("exit %d, violations %d, %d crashes after a charge; want a clean run with one\nstdout:\n%s\nstderr:\n%s", code, r["violations"], r["crashes_after_charge"], stdout, stderr)
	}
}

// A run of a single payment with --abandon abandons that payment (the
// one drawn from the first half), and the load sends it: its last
// quarter, which begins at the first payment then, waits for the
// abandoned client's try only once that try can be sent, not for a try
// the wait itself holds back until --timeout ends the load.
func TestTortureRequestsOneAbandonedPayment(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--acquirer", "private", "--abandon", "0.5", "--crash-after-charge", "-1", "--payments", "1", "--dups", "1", "--timeout", "30s")
	if code != exitOK || r["violations"] != 0 || r["abandoned"] != 1 {
		t.Fatalf("exit %d, violations %d, %d abandoned; want a clean run, its one payment abandoned\nstdout:\n%s\nstderr:\n%s", code, r["violations"], r["abandoned"], stdout, stderr)
	}
}

// Clients that never come back: half the logical payments send one
// attempt, which SIGKILLs its replica between the network's charge and
// the payment's commit, and give up. Only the replicas' completers finish
// them, with nobody asking: each abandoned payment ends charged once and
// recorded (or, when its try died before its recovery point, neither), and
// the books agree.
func TestTortureRequestsAbandoned(t *testing.T) {
	t.Parallel()
	for name, db := range map[string][]string{"sqlite": nil, "postgres": {"--db", postgresURL(t)}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := append(db, "--acquirer", "private", "--abandon", "0.5", "--payments", "300", "--dups", "2",
				"--kill-every", "1s", "--timeout", "300s")
			code, stdout, stderr, r := runTorture(t, args...)
			if code != exitOK || r["violations"] != 0 || !strings.Contains(stdout, "promise: HELD") {
				t.Fatalf("exit %d, violations %d\nstdout:\n%s\nstderr:\n%s", code, r["violations"], stdout, stderr)
			}
			if d, ok := r["reconcile_differences"]; !ok || d != 0 {
				t.Errorf("idem reconcile: ran %v, %d differences; want it run, with none", ok, d)
			}
			// Each abandoned payment is checked against the completers'
			// bound from its last holder's end (a violation otherwise); the
			// slowest and the bound are shown. That end is the client's
			// try's death, or a completer's resume or claim of it that
			// failed or that its replica's death cut off (a claim logs
			// before it is sent; the replicas share the run's key digest
			// secret, so the torture reads whose key a claim was), and
			// a replica's round that gave up restarts that replica's
			// window when it began in it (keyed.Completer logs both): on a
			// starved machine a resume's lease renewals can stall past a
			// third of the lease, the execution is cancelled, its outcome
			// unknown, and the key waits out that completer's lease
			// (keyed.Completer's bound holds "when its outcome can be
			// learned"). The bound itself is not widened; it restarts only
			// for the payment whose resume a replica logged as failed.
			t.Logf("slowest abandoned payment finished %ss after its holder died; the completers' bound %ss; bounds counted from a failed resume %d, from a resume or claim cut off by its replica's death %d, from a failed claim %d",
				resultText(stdout, "slowest_finish_s"), resultText(stdout, "finish_bound_s"), r["from_failed_resume"], r["from_cut_off_resume"], r["from_failed_claim"])
			t.Logf("%d abandoned, %d finished by a completer, %d crashes after a charge", r["abandoned"], r["abandoned_finished"], r["crashes_after_charge"])
			if r["abandoned"] == 0 || r["abandoned_finished"] == 0 {
				t.Errorf("%d abandoned, %d finished by a completer; want some of each\n%s", r["abandoned"], r["abandoned_finished"], stdout)
			}
			if want := r["logical_payments"] - r["abandoned"] + r["abandoned_finished"]; r["payments"] != want || r["charges"] != want {
				t.Errorf("%d payments, %d charges; want %d of each (every payment whose client stayed, and every abandoned one a completer finished)\n%s",
					r["payments"], r["charges"], want, stdout)
			}
			if r["money_taken"] != r["money_owed"] || r["money_taken_api"] != r["money_owed"] {
				t.Errorf("money taken %d (database) and %d (API), owed %d", r["money_taken"], r["money_taken_api"], r["money_owed"])
			}
		})
	}
}

// Faults between the replicas and their stores: COMMIT's answer lost after
// the database committed (the ambiguous commit), connections reset, and
// latency, on PostgreSQL with the keys in Redis too. Nothing twice, nothing
// lost.
func TestTortureRequestsStoreFaults(t *testing.T) {
	t.Parallel()
	pg, rd := postgresURL(t), redisURL(t)
	for name, args := range map[string][]string{
		"postgres":       {"--db", pg, "--payments", "300", "--commit-cuts", "0.1", "--store-resets", "0.002", "--store-latency", "1ms"},
		"postgres+redis": {"--db", pg, "--keys", rd, "--payments", "200", "--commit-cuts", "0.1", "--store-resets", "0.002", "--store-outage-every", "2s", "--store-outage-for", "500ms"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr, r := runTorture(t, append(args, "--kill-every", "500ms", "--timeout", "90s")...)
			checkHeld(t, r["logical_payments"], code, stdout, stderr, r)
			t.Logf("commit cuts %d, store resets %d, store outages %d", r["commit_cuts"], r["store_resets"], r["store_outages"])
			if r["commit_cuts"] == 0 || r["store_resets"] == 0 {
				t.Errorf("commit cuts %d, store resets %d: the faults did not happen", r["commit_cuts"], r["store_resets"])
			}
			if name == "postgres+redis" && r["store_outages"] == 0 {
				t.Errorf("no store outage happened")
			}
		})
	}
}

// Private PostgreSQL and Redis servers of the run's own, SIGKILLed in turn
// and started again under the load, on top of the lost answers, the killed
// replicas and a store proxy's resets: the replicas ride through the
// restarts (their requests answered 5xx meanwhile, and retried), and
// nothing is charged twice or lost. Each store's first restart, the first
// kill and the first reset come at payments of the first half drawn from
// the seed, so 250 payments prove what 500 did (whose run took 59s in CI).
func TestTortureRequestsStoreRestarts(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--db", "private", "--keys", "private", "--restart-stores-every", "1500ms",
		"--payments", "250", "--store-resets", "0.002", "--kill-every", "500ms", "--timeout", "90s")
	if code != exitOK && strings.Contains(stderr, "which is not installed") {
		// The servers' programs (initdb and postgres, redis-server), which
		// the run starts itself.
		if os.Getenv(idemtest.RequireServicesEnv) == "1" {
			t.Fatalf("%s; %s=1 requires them", strings.TrimSpace(stderr), idemtest.RequireServicesEnv)
		}
		t.Skipf("skipping: %s", strings.TrimSpace(stderr))
	}
	checkHeld(t, 250, code, stdout, stderr, r)
	if r["store_restarts"] < 2 {
		t.Errorf("%d store restarts, want at least 2\n%s", r["store_restarts"], stdout)
	}
	if r["store_resets"] == 0 {
		t.Errorf("no store reset: the scheduled one did not happen\n%s", stdout)
	}
	if !strings.Contains(stdout, "RESULT,torture-requests-pg-keys,store_restarts,") {
		t.Errorf("no RESULT line for the store restarts:\n%s", stdout)
	}
}

// A Redis run as a cache, keeping nothing on disk, restarted under the
// load: every restart forgets every key, finished or in flight, and the
// payments' look-back for a payment made under the same key is all that
// keeps a retry from charging again. Two restarts and the first kill come
// at payments of the first half drawn from the seed, so 300 payments
// prove what 600 did (whose run took 44s in CI).
func TestTortureRequestsVolatileKeys(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--keys", "private-volatile", "--restart-stores-every", "300ms",
		"--payments", "300", "--kill-every", "500ms", "--timeout", "90s")
	if code != exitOK && strings.Contains(stderr, "which is not installed") {
		if os.Getenv(idemtest.RequireServicesEnv) == "1" {
			t.Fatalf("%s; %s=1 requires it", strings.TrimSpace(stderr), idemtest.RequireServicesEnv)
		}
		t.Skipf("skipping: %s", strings.TrimSpace(stderr))
	}
	checkHeld(t, 300, code, stdout, stderr, r)
	if r["store_restarts"] < 2 {
		t.Errorf("%d store restarts, want at least 2\n%s", r["store_restarts"], stdout)
	}
}

func TestTortureRequestsRedisKeys(t *testing.T) {
	t.Parallel()
	url := redisURL(t)
	code, stdout, stderr, r := runTorture(t, "--keys", url, "--payments", "300", "--kill-every", "300ms", "--timeout", "90s")
	checkHeld(t, 300, code, stdout, stderr, r)
	if !strings.Contains(stdout, "RESULT,torture-requests-sqlite-keys,") {
		t.Errorf("no RESULT lines named torture-requests-sqlite-keys:\n%s", stdout)
	}
}

// TestTortureRequestsCatchesUnsafe is the torture's own test: against a
// service that breaks the promise it must say so, by key, and fail.
func TestTortureRequestsCatchesUnsafe(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--unsafe-no-idempotency", "--payments", "200", "--kill-every", "300ms", "--timeout", "90s")
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	if r["logical_payments"] != 200 || r["payments"] <= 200 {
		t.Errorf("logical payments %d, payments %d: want more payments than logical payments", r["logical_payments"], r["payments"])
	}
	if r["money_taken"] <= r["money_owed"] || r["violations"] == 0 {
		t.Errorf("money taken %d, owed %d, violations %d", r["money_taken"], r["money_owed"], r["violations"])
	}
	for _, want := range []string{"promise: BROKEN", "payments in the database for one logical payment", "different payment ids", "RESULT,torture-requests-sqlite-unsafe,"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

func TestTortureRequestsUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--payments", "0"},
		{"--dups", "-1"},
		{"--drop", "1"},
		{"--drop", "-0.1"},
		{"--timeout", "0"},
		{"--db", "mysql://x"},
		{"--db", "sqlite:/tmp/x.db"},
		{"--keys", "memcached://x"},
		{"--commit-cuts", "0.1"},
		{"--db", "postgres://u@h/db", "--store-resets", "1"},
		{"--db", "postgres://u@h/db", "--store-latency", "-1s"},
		{"--db", "postgres://u@h/db", "--store-outage-every", "1s", "--store-outage-for", "0s"},
		{"--restart-stores-every", "1s"},
		{"--db", "postgres://u@h/db", "--keys", "redis://h/0", "--restart-stores-every", "1s"},
		{"--db", "private", "--restart-stores-every", "-1s"},
		{"--keys", "privately"},
		{"extra"},
	} {
		code, stdout, stderr, _ := runTorture(t, args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, "idem: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d and a message", args, code, stdout, stderr, exitUsage)
		}
	}
}

// TestTortureRequestsTimeout: --timeout bounds the time without a logical
// payment completing, and the logical payments left unanswered when it
// passes are violations, not a success. With nearly every answer dropped no
// payment gets its 2xx answers, and the run ends a second after it began.
func TestTortureRequestsTimeout(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTorture(t, "--payments", "50", "--drop", "0.999", "--kill-every", "0", "--timeout", "1s")
	if code != exitFailure || r["answered"] != 0 || r["violations"] == 0 ||
		!strings.Contains(stdout, "got no 2xx answer before the timeout (1s without a logical payment completing)") {
		t.Errorf("exit %d, answered %d, violations %d; want exit 1 and unanswered payments reported\nstdout:\n%s\nstderr:\n%s",
			code, r["answered"], r["violations"], stdout, stderr)
	}
}

// signalWriter is a stderr that calls fn, once, when what was written so
// far contains want.
type signalWriter struct {
	buf  syncBuffer
	want string
	once sync.Once
	fn   func()
}

func (w *signalWriter) Write(p []byte) (int, error) {
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(w.fn)
	}
	return n, err
}

// TestTortureRequestsInterrupted: a run cancelled in the middle (Ctrl-C)
// leaves no replica running and no schema behind. Not parallel: it counts
// this process's children, which the other torture tests would add to.
func TestTortureRequestsInterrupted(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts children through /proc")
	}
	url := privateDatabase(t, postgresURL(t))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stderr := &signalWriter{want: "logical payments done", fn: cancel}
	var stdout bytes.Buffer
	code := run(ctx, append([]string{"torture", "requests", "--db", url, "--payments", "20000", "--timeout", "2m"}, seedArgs(t)...), &stdout, stderr)
	if code != exitFailure || !strings.Contains(stderr.buf.String(), "context canceled") {
		t.Errorf("exit %d, want %d with the cancellation on stderr:\n%s", code, exitFailure, stderr.buf.String())
	}
	if kids := children(t); len(kids) > 0 {
		t.Errorf("processes left running: %v", kids)
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var left int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'idem\_torture\_%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d idem_torture_ schemas left", left)
	}
}

// privateDatabase creates a database of the test's own on the server at url
// and returns its URL; it is dropped when the test ends. Counting what a run
// leaves behind is exact there: the shared database may hold another
// process's runs at the same moment.
func privateDatabase(t *testing.T, url string) string {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	name := randomName("idem_test_db_")
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Errorf("dropping %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// children lists the processes whose parent is this one, as "pid command".
func children(t *testing.T) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var kids []string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // it ended meanwhile
		}
		// pid (comm) state ppid …; comm may hold spaces, so cut at its end.
		_, rest, ok := strings.Cut(string(b), ") ")
		if f := strings.Fields(rest); ok && len(f) > 1 && f[1] == me {
			kids = append(kids, strings.TrimSpace(string(b[:strings.Index(string(b), ") ")+1])))
		}
	}
	return kids
}

// TestTortureSeedPrintedAtTheStart: both tortures say their seed before
// anything can fail, and the error of a run that aborts names it too, so
// a run that ends without a report (here: a database or a broker nobody
// answers on) can still be replayed.
func TestTortureSeedPrintedAtTheStart(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"requests", "--db", "postgres://postgres@127.0.0.1:1/test"},
		{"messages", "--broker", "nats://127.0.0.1:1"},
	} {
		for _, seed := range []string{"", "7"} {
			argv := append([]string{"torture"}, args...)
			if seed != "" {
				argv = append(argv, "--seed", seed)
			}
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), argv, &stdout, &stderr)
			m := regexp.MustCompile(`^torture: seed (\d+) \(the same arguments and --seed (\d+) draw the same plan and scheduled faults; the machine's timing is not replayed\)\n`).FindStringSubmatch(stderr.String())
			switch {
			case code != exitFailure:
				t.Errorf("%q: exit %d, want %d\nstderr:\n%s", argv, code, exitFailure, stderr.String())
			case m == nil || m[1] != m[2]:
				t.Errorf("%q: stderr does not open with the seed:\n%s", argv, stderr.String())
			case seed != "" && m[1] != seed:
				t.Errorf("%q: seed %s printed, want %s", argv, m[1], seed)
			case !strings.Contains(stderr.String(), "(seed "+m[1]+": the same arguments and --seed "+m[1]+" draw the same plan and scheduled faults; the machine's timing is not replayed)"):
				t.Errorf("%q: the error does not name the seed %s:\n%s", argv, m[1], stderr.String())
			}
		}
	}
	if got, want := seedReplay("TestTortureMessages/nats-pg", 42), `the same plan and scheduled faults (not the machine's timing) with IDEM_TORTURE_SEED=42 go test -run '^TestTortureMessages$/^nats-pg$' ./cmd/idem`; got != want {
		t.Errorf("seedReplay = %s, want %s", got, want)
	}
}
