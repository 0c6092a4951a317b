package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietRedis{}) // as main does
	// A rueidis client whose first connection failed (a --keys Redis that
	// does not answer, as the tests of clear errors give) schedules a
	// refresh of its view after a random delay of up to a second, from a
	// goroutine its Close does not stop; the refresh finds the client
	// closed and ends.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

// syncBuffer is a bytes.Buffer safe for a command writing on one goroutine
// while the test reads on another.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runCmd runs the command line to completion.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// server is an `idem serve` running on its own goroutine.
type server struct {
	base   string
	stderr *syncBuffer
	cancel context.CancelFunc
	done   chan int
	lines  chan struct{}
	once   sync.Once
	code   int
}

// startServe runs serve with args (and --addr 127.0.0.1:0 added), waits for
// its "listening on" line and then for /healthz to answer.
func startServe(t *testing.T, a *app, args ...string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	s := &server{stderr: &syncBuffer{}, cancel: cancel, done: make(chan int, 1), lines: make(chan struct{})}
	a.stderr = pw
	listening := make(chan string, 1)
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(s.stderr, line)
			if addr, ok := strings.CutPrefix(line, "idem: listening on "); ok {
				select {
				case listening <- addr:
				default:
				}
			}
		}
		_, _ = io.Copy(s.stderr, pr) // a line too long for the scanner
	}()
	go func() {
		code := a.run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...))
		pw.Close()
		s.done <- code
	}()
	t.Cleanup(func() { s.stop() })

	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case s.base = <-listening:
	case <-s.done:
		s.done <- -1 // keep stop from blocking; the real code is reported below
		t.Fatalf("serve exited before listening; stderr:\n%s", s.stderr)
	case <-deadline.C:
		t.Fatalf("serve did not say where it listens within 30s; stderr:\n%s", s.stderr)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for {
		resp, err := client.Get(s.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-deadline.C:
			t.Fatalf("/healthz did not answer 200 within 30s (last error %v); stderr:\n%s", err, s.stderr)
		case <-time.After(10 * time.Millisecond): // poll interval
		}
	}
}

// stop cancels serve's context and returns its exit status.
func (s *server) stop() int {
	s.once.Do(func() {
		s.cancel()
		s.code = <-s.done
		<-s.lines
	})
	return s.code
}

// call makes one request to the server and decodes a JSON answer into out.
func (s *server) call(t *testing.T, method, path, apiKey, idemKey string, body any, out any) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, s.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp
}

func newApp(env map[string]string) *app {
	return &app{
		stdout:    io.Discard,
		stderr:    io.Discard,
		lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	}
}

type accountBody struct {
	ID      string `json:"id"`
	Balance int64  `json:"balance"`
}

type paymentBody struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

func TestServeChargesOnceAndShutsDown(t *testing.T) {
	t.Parallel()
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	const apiKey = "test-key-1"
	srv := startServe(t, newApp(nil), "--db", dbURL, "--api-keys", "acme:"+apiKey, "--log-level", "warn")
	paymentID := checkChargesOnce(t, srv, apiKey)
	stopCleanly(t, srv)

	// The tools read the database the server left behind.
	checkKeysTools(t, paymentID, "--db", dbURL)
}

// checkChargesOnce opens an account, pays from it twice with one key and
// checks the second answer is the first replayed and the balance was
// debited once. It returns the payment's id.
func checkChargesOnce(t *testing.T, srv *server, apiKey string) string {
	t.Helper()
	if resp := srv.call(t, "GET", "/v1/accounts/nope", "", "", nil, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without an API key: status %d, want 401", resp.StatusCode)
	}
	var acct accountBody
	if resp := srv.call(t, "POST", "/v1/accounts", apiKey, "acct-1", map[string]any{"balance": 100000, "currency": "KRW"}, &acct); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/accounts: status %d, want 201", resp.StatusCode)
	}
	pay := map[string]any{"account_id": acct.ID, "amount": 12000, "currency": "KRW"}
	var first, second paymentBody
	if resp := srv.call(t, "POST", "/v1/payments", apiKey, "pay-1", pay, &first); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/payments: status %d, want 201", resp.StatusCode)
	}
	resp := srv.call(t, "POST", "/v1/payments", apiKey, "pay-1", pay, &second)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry with the same key: status %d, Idempotent-Replayed %q; want 201 replayed",
			resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if first.ID == "" || second.ID != first.ID {
		t.Errorf("retry answered payment %q, first was %q", second.ID, first.ID)
	}
	var after accountBody
	srv.call(t, "GET", "/v1/accounts/"+acct.ID, apiKey, "", nil, &after)
	if after.Balance != 100000-12000 {
		t.Errorf("balance after a payment and its retry = %d, want %d", after.Balance, 100000-12000)
	}
	return first.ID
}

// stopCleanly stops the server and checks it exited 0 without logging an
// error.
func stopCleanly(t *testing.T, srv *server) {
	t.Helper()
	if code := srv.stop(); code != exitOK {
		t.Fatalf("serve exit status after cancel = %d, want 0; stderr:\n%s", code, srv.stderr)
	}
	if strings.Contains(srv.stderr.String(), "level=ERROR") {
		t.Errorf("serve logged errors:\n%s", srv.stderr)
	}
}

// checkKeysTools runs keys show and keys purge on the store a server left
// behind (where args point), after checkChargesOnce.
func checkKeysTools(t *testing.T, paymentID string, args ...string) {
	t.Helper()
	show := append([]string{"keys", "show"}, args...)
	code, out, errOut := runCmd(t, append(show, "--scope", "acme", "pay-1")...)
	if code != exitOK {
		t.Fatalf("keys show: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"completed", "201 Created", paymentID, "fingerprint", "v1:", "expires"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys show output lacks %q:\n%s", want, out)
		}
	}
	code, _, errOut = runCmd(t, append(show, "--scope", "other-tenant", "pay-1")...)
	if code != exitFailure || !strings.Contains(errOut, "no idempotency key") {
		t.Errorf("keys show in another scope: exit %d, stderr %q; want 1 and 'no idempotency key'", code, errOut)
	}
	code, out, errOut = runCmd(t, append([]string{"keys", "purge"}, args...)...)
	if code != exitOK || out != "purged 0 expired idempotency keys\n" {
		t.Errorf("keys purge of unexpired keys: exit %d, stdout %q, stderr %q; want 0 purged", code, out, errOut)
	}
}

func TestServeAPIKeySources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		env       map[string]string
		args      []string
		works     string // an API key that must be accepted; "dev" means the printed one
		refused   string // an API key that must be refused
		stderrHas string
	}{
		{
			name:  "environment",
			env:   map[string]string{envAPIKeys: "envco:env-key"},
			works: "env-key",
		},
		{
			name:    "flag wins over environment",
			env:     map[string]string{envAPIKeys: "envco:env-key"},
			args:    []string{"--api-keys", "flagco:flag-key"},
			works:   "flag-key",
			refused: "env-key",
		},
		{
			name:      "development key when none is configured",
			works:     "dev",
			stderrHas: `development tenant "dev"`,
		},
		{
			name:      "unsafe mode warns",
			args:      []string{"--api-keys", "x:unsafe-key", "--unsafe-no-idempotency"},
			works:     "unsafe-key",
			stderrHas: "WARNING: --unsafe-no-idempotency",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}, tc.args...)
			srv := startServe(t, newApp(tc.env), args...)
			key := tc.works
			if key == "dev" {
				key = devKeyFrom(t, srv.stderr.String())
			}
			if resp := srv.call(t, "POST", "/v1/accounts", key, "", map[string]any{"balance": 1, "currency": "KRW"}, nil); resp.StatusCode != http.StatusCreated {
				t.Errorf("with key %q: status %d, want 201", tc.works, resp.StatusCode)
			}
			if tc.refused != "" {
				if resp := srv.call(t, "GET", "/v1/accounts/x", tc.refused, "", nil, nil); resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("with key %q: status %d, want 401", tc.refused, resp.StatusCode)
				}
			}
			if code := srv.stop(); code != exitOK {
				t.Errorf("exit status %d, want 0", code)
			}
			if !strings.Contains(srv.stderr.String(), tc.stderrHas) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderrHas, srv.stderr)
			}
		})
	}
}

// devKeyFrom finds the development key in serve's banner.
func devKeyFrom(t *testing.T, stderr string) string {
	t.Helper()
	for line := range strings.Lines(stderr) {
		if k, ok := strings.CutPrefix(strings.TrimSpace(line), "KEY="); ok {
			return k
		}
	}
	t.Fatalf("no development key in stderr:\n%s", stderr)
	return ""
}

func TestServeNeverEchoesPasswords(t *testing.T) {
	t.Parallel()
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, args := range [][]string{
		// Nothing listens on port 1: the connection is refused at once.
		{"--db", "postgres://user:s3cret@127.0.0.1:1/idem?connect_timeout=2"},
		{"--db", "postgresql://user:s3cret@127.0.0.1:1/idem?connect_timeout=2"},
		{"--db", dbURL, "--keys", "redis://:s3cret@127.0.0.1:1/0"},
		{"--db", "postgres://user:s3cret%zz@h/idem"},
	} {
		code, _, errOut := runCmd(t, append([]string{"serve", "--api-keys", "a:b"}, args...)...)
		if code != exitFailure || strings.Count(errOut, "\n") != 1 {
			t.Errorf("serve %v: exit %d, stderr %q; want 1 and one line", args, code, errOut)
		}
		if strings.Contains(errOut, "s3cret") {
			t.Errorf("serve %v: stderr leaks the password: %q", args, errOut)
		}
	}
}

func TestDemoCommand(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, "demo", "--customers", "2")
	if code != exitOK {
		t.Fatalf("demo: exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "money taken") || !strings.Contains(out, "exactly once") {
		t.Errorf("demo output lacks the table:\n%s", out)
	}
}

// `idem demo messages` exits 0, and its tables say, row by row, that each
// unsafe consumer failed the way its scenario says and each protected one
// held.
func TestDemoMessagesCommand(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, "demo", "messages")
	if code != exitOK {
		t.Fatalf("demo messages: exit %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var rows []string
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "unsafe ") || strings.HasPrefix(line, "protected ") {
			rows = append(rows, strings.TrimSpace(line))
		}
	}
	want := []struct{ run, consumer, verdict string }{
		{"unsafe", "no inbox", "COUNTED TWICE (+72,000 KRW)"},
		{"protected", "inbox in the effect's tx", "exactly once"},
		{"unsafe", "retries its head every 1s, forever", "BLOCKED: 20 healthy events stuck behind it"},
		{"protected", "idem: 10 attempts, jittered backoff", "flows; poison dead-lettered after 10 attempts"},
		{"unsafe", "no jitter", "FELL OVER AGAIN (3 times)"},
		{"protected", "full jitter", "held"},
		{"unsafe", "adds, unordered", "HISTORY WRONG (went to -5,000 KRW): adding needs order"},
		{"unsafe", "sets status, unordered", "WRONG STATE (5 refunds undone): setting needs order or versions"},
		{"protected", "adds, per-key order", "right: it keeps per-key order"},
		{"protected", "sets status, per-key order", "right: it keeps per-key order"},
		{"protected", "sets status+version, unordered", "right: a version needs no order"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d table rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i, w := range want {
		if !strings.HasPrefix(rows[i], w.run+" ") || !strings.Contains(rows[i], "  "+w.consumer+"  ") || !strings.HasSuffix(rows[i], "  "+w.verdict) {
			t.Errorf("row %d: %q; want %s, %s, ending %q", i+1, rows[i], w.run, w.consumer, w.verdict)
		}
	}
	if !strings.Contains(out, "idem dlq show dl_") {
		t.Errorf("output does not name the command that reads the poison's dead letter:\n%s", out)
	}
}

func TestKeysPurgeOnNewDatabase(t *testing.T) {
	t.Parallel()
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "new.db")

	code, _, errOut := runCmd(t, "keys", "purge", "--db", dbURL)
	if code != exitFailure || !strings.Contains(errOut, "does not exist") {
		t.Errorf("keys purge before migrate: exit %d, stderr %q; want 1 and 'does not exist'", code, errOut)
	}
	code, out, errOut := runCmd(t, "migrate", "--db", dbURL)
	if code != exitOK || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "keys", "purge", "--db", dbURL)
	if code != exitOK || out != "purged 0 expired idempotency keys\n" {
		t.Errorf("keys purge: exit %d, stdout %q, stderr %q; want 0 and 'purged 0 …'", code, out, errOut)
	}
}

func TestExitStatuses(t *testing.T) {
	t.Parallel()
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, tc := range []struct {
		args      []string
		code      int
		stdoutHas string
		stderrHas string
	}{
		{[]string{"version"}, exitOK, "idem ", ""},
		{[]string{"version", "--modules"}, exitOK, "  github.com/idem-go/idem/idemsqlite ", ""},
		{[]string{"--help"}, exitOK, "idem demo", ""},
		{[]string{"nosuch"}, exitUsage, "", `unknown command "nosuch"`},
		{[]string{"serv"}, exitUsage, "", `did you mean "serve"?`},
		{[]string{"serve", "--no-such-flag"}, exitUsage, "", "unknown flag: --no-such-flag"},
		{[]string{"serve", "extra"}, exitUsage, "", "Run 'idem serve --help' for usage."},
		{[]string{"keys", "show", "--db", dbURL, "k"}, exitUsage, "", `required flag(s) "scope" not set`},
		{[]string{"keys", "show", "--db", dbURL, "--scope", "t"}, exitUsage, "", "accepts 1 arg(s)"},
		{[]string{"keys", "show", "--db", dbURL, "--scope", "t", "bad key"}, exitUsage, "", "invalid idempotency key"},
		{[]string{"demo", "--customers", "0"}, exitUsage, "", "--customers must be between 1 and 1000"},
		{[]string{"demo", "messages", "--capacity", "0"}, exitUsage, "", "--capacity must be between 1 and 10000"},
		{[]string{"demo", "messages", "extra"}, exitUsage, "", "Run 'idem demo messages --help' for usage."},
		{[]string{"serve", "--db", "mysql://x", "--api-keys", "a:b"}, exitFailure, "", `unsupported database scheme "mysql"`},
		{[]string{"serve", "--db", dbURL, "--api-keys", "no-colon"}, exitFailure, "", "--api-keys: "},
		{[]string{"serve", "--db", dbURL, "--log-level", "loud"}, exitFailure, "", `--log-level "loud"`},
		{[]string{"serve", "--db", dbURL, "--pg-schema", "x", "--api-keys", "a:b"}, exitFailure, "", "--pg-schema applies only to --db postgres://"},
		{[]string{"serve", "--db", dbURL, "--keys", "memcached://h", "--api-keys", "a:b"}, exitFailure, "", `unsupported key store scheme "memcached"`},
		{[]string{"serve", "--db", dbURL, "--key-lease", "2h", "--key-ttl", "1h", "--api-keys", "a:b"}, exitFailure, "", "--key-lease (2h0m0s) must not be longer than --key-ttl"},
		{[]string{"serve", "--db", dbURL, "--key-lease", "-1s", "--api-keys", "a:b"}, exitFailure, "", "--key-lease must not be negative"},
		{[]string{"serve", "--db", dbURL, "--request-timeout", "2s", "--api-keys", "a:b"}, exitFailure, "", "--request-timeout (2s) must be longer than --inflight-wait (5s)"},
		{[]string{"migrate", "--db", dbURL, "--pg-schema", "x"}, exitFailure, "", "--pg-schema applies only"},
		{[]string{"keys", "show", "--db", dbURL, "--scope", "t", "k"}, exitFailure, "", "does not exist"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runCmd(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit status %d, want %d; stderr %q", code, tc.code, errOut)
			}
			if !strings.Contains(out, tc.stdoutHas) {
				t.Errorf("stdout lacks %q:\n%s", tc.stdoutHas, out)
			}
			if !strings.Contains(errOut, tc.stderrHas) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderrHas, errOut)
			}
			if tc.code == exitFailure && strings.Count(errOut, "\n") != 1 {
				t.Errorf("a failure should be one line on stderr, got %q", errOut)
			}
		})
	}
}
