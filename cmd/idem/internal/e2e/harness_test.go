package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/startwatch"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

// Bounds of the harness's waits. They are deadlines for polls, not sleeps:
// a healthy run finishes each wait in milliseconds.
const (
	startTimeout = 30 * time.Second // a replica that does no work prints its address (startwatch)
	readyTimeout = 15 * time.Second // /healthz answers 200
	exitTimeout  = 20 * time.Second // a signalled replica is reaped
	logTailLines = 300
)

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// requirePrerequisite reports a missing prerequisite that is not a
// network service (a binary, root): skipped locally with the reason,
// fatal where services are required.
func requirePrerequisite(t *testing.T, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv(idemtest.RequireServicesEnv) == "1" {
		t.Fatalf("%s; %s=1 requires it", reason, idemtest.RequireServicesEnv)
	}
	t.Skipf("skipping: %s; set %s=1 to fail instead", reason, idemtest.RequireServicesEnv)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	idemtest.Eventually(t, timeout, what, cond)
}

// --- one test's world ---

// testEnv is what one test owns on the shared services: a PostgreSQL schema,
// optionally a Redis key prefix, and a tenant with its API key.
type testEnv struct {
	t        *testing.T
	pgURL    string
	schema   string
	pool     *pgxpool.Pool
	redisURL string // empty: the keys live in PostgreSQL
	prefix   string
	rdb      *redis.Client
	tenant   string
	apiKey   string
	// hc performs the harness's own reads and writes. Keep-alives are off
	// everywhere in these tests: net/http silently re-sends a request that
	// carries an Idempotency-Key on a reused connection that broke, which
	// would hide attempts from the tests that count them.
	hc *http.Client
}

// newEnv gates the test on PostgreSQL and gives it a fresh schema, dropped
// when the test ends (after its replicas, which are registered later and
// so cleaned up first).
func newEnv(t *testing.T) *testEnv {
	t.Helper()
	return newEnvAt(t, idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
}

// newEnvAt is newEnv on the PostgreSQL at pgURL, which the caller has
// made sure is there.
func newEnvAt(t *testing.T, pgURL string) *testEnv {
	t.Helper()
	e := &testEnv{
		t:      t,
		pgURL:  pgURL,
		schema: "e2e_" + randHex(6),
		tenant: "tenant_" + randHex(4),
		apiKey: "sk_e2e_" + randHex(16),
		hc:     &http.Client{Transport: newHTTPTransport(), Timeout: 30 * time.Second},
	}
	t.Cleanup(e.hc.CloseIdleConnections)
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		t.Fatalf("PostgreSQL URL: %v", err)
	}
	cfg.MaxConns = 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		defer e.pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		drop := "DROP SCHEMA IF EXISTS " + pgx.Identifier{e.schema}.Sanitize() + " CASCADE"
		if _, err := e.pool.Exec(ctx, drop); err != nil {
			t.Errorf("dropping schema %s: %v", e.schema, err)
		}
	})
	return e
}

// withRedisKeys gates the test on the shared Redis and makes its replicas
// keep their keys there, under a prefix of the test's own.
func (e *testEnv) withRedisKeys() *testEnv {
	e.t.Helper()
	url := idemtest.RequireService(e.t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	e.useRedis(url)
	return e
}

// useRedis points the replicas' keys at url under a fresh prefix, and
// deletes what is left under it when the test ends.
func (e *testEnv) useRedis(url string) {
	t := e.t
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("Redis URL: %v", err)
	}
	e.redisURL = url
	e.prefix = "e2e" + randHex(6)
	e.rdb = redis.NewClient(opts)
	t.Cleanup(func() {
		defer e.rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := deletePrefix(ctx, e.rdb, e.prefix); err != nil {
			t.Errorf("deleting Redis keys under %s: %v", e.prefix, err)
		}
	})
}

// redisKeyState reads the state field of an idempotency record as idemredis
// keeps it (a hash at "<prefix>:{<scope>}:<key>"; the tenant is the scope).
// It is empty when there is no record.
func (e *testEnv) redisKeyState(ctx context.Context, key string) (string, error) {
	// Read through the store itself, so the test does not depend on how it
	// lays records out in Redis.
	store, err := idemredis.NewStore(ctx, e.rdb, &idemredis.Config{Prefix: e.prefix})
	if err != nil {
		return "", err
	}
	defer store.Close()
	rec, err := store.Get(ctx, idem.Scope(e.tenant), idem.Key(key))
	if errors.Is(err, idem.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return rec.State.String(), nil
}

// deletePrefix deletes every key under prefix with SCAN, never a flush:
// the Redis is shared with other tests.
func deletePrefix(ctx context.Context, rdb *redis.Client, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+":*", 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return rdb.Unlink(ctx, batch...).Err()
	}
	return nil
}

// serveArgs are the arguments of `idem serve` for a replica of this test.
func (e *testEnv) serveArgs(extra ...string) []string {
	args := []string{"serve", "--addr", "127.0.0.1:0", "--db", e.pgURL, "--pg-schema", e.schema,
		"--api-keys", e.tenant + ":" + e.apiKey, "--log-level", "info"}
	if e.redisURL != "" {
		args = append(args, "--keys", e.redisURL, "--keys-prefix", e.prefix)
	}
	return append(args, extra...)
}

// keyClaimOpen reports whether a transaction that claimed a key is open
// and waiting for its client: idempg claims a key in the request's own
// transaction, by an advisory lock on the key (at READ COMMITTED, with no
// row until the commit) or by a row nobody else sees until it commits, so
// the claim shows as a session idle in a transaction that has read or
// written idem_keys and holds an advisory lock, or holds idem_keys for
// writing.
func (e *testEnv) keyClaimOpen(ctx context.Context) (bool, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.relation = to_regclass($1) AND a.state = 'idle in transaction'
		AND (l.mode = 'RowExclusiveLock'
			OR EXISTS (SELECT FROM pg_locks k WHERE k.pid = l.pid AND k.locktype = 'advisory' AND k.granted))`,
		pgx.Identifier{e.schema, "idem_keys"}.Sanitize()).Scan(&n)
	return n > 0, err
}

func newHTTPTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: time.Minute,
	}
}

// --- replicas ---

// replica is one `idem serve` process.
type replica struct {
	name string
	cmd  *exec.Cmd
	URL  string // http://127.0.0.1:PORT once ready

	addr chan string   // the listening line's address, once
	done chan struct{} // closed once the process is reaped
	// expectExit is set before the test kills or stops the replica, or asks
	// it to kill itself; an exit without it is a crash the test reports.
	expectExit atomic.Bool

	// start bounds the wait for its address by its progress: on a loaded
	// machine a start that keeps working may outlast startTimeout.
	start *startwatch.Watch

	mu   sync.Mutex
	tail []string
	// stacks is set once quit has asked for the goroutines' stacks: every
	// line from then on is kept, for they run past logTailLines (a running
	// `idem serve` prints over 400), and their first lines name what the
	// start waited for.
	stacks bool
}

// launch starts a replica; ready waits for it. Starting several replicas
// before waiting for any lets them boot (and migrate) together.
func launch(t *testing.T, name string, args ...string) *replica {
	t.Helper()
	r := &replica{name: name, addr: make(chan string, 1), done: make(chan struct{})}
	r.cmd = exec.Command(idemBin, args...)
	r.cmd.Stdout = io.Discard
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatalf("replica %s: %v", name, err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting replica %s: %v", name, err)
	}
	r.start = startwatch.New(r.cmd.Process.Pid, startTimeout, time.Now())
	// Reading stderr to its end before Wait is what exec requires; the end
	// comes when the process dies, so this goroutine also reaps it.
	go func() {
		defer close(r.done)
		br := bufio.NewReader(stderr)
		sent := false
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				line = strings.TrimRight(line, "\n")
				r.log(line)
				if after, ok := strings.CutPrefix(line, "idem: listening on "); ok && !sent {
					r.addr <- strings.TrimSpace(after)
					sent = true
				}
			}
			if err != nil {
				break
			}
		}
		_ = r.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
			if !r.expectExit.Load() {
				t.Errorf("replica %s exited on its own: %s", name, r.cmd.ProcessState)
			}
		default:
			r.expectExit.Store(true)
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
				if !r.cmd.ProcessState.Success() {
					t.Errorf("replica %s did not stop cleanly on SIGTERM: %s", name, r.cmd.ProcessState)
				}
			case <-time.After(exitTimeout):
				t.Errorf("replica %s ignored SIGTERM for %s; killing it", name, exitTimeout)
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
		if t.Failed() && !r.quitted() {
			t.Logf("replica %s, last lines of stderr:\n%s", name, r.logs())
		}
	})
	return r
}

// ready waits until the replica prints its address and /healthz answers.
func (r *replica) ready(t *testing.T, hc *http.Client) *replica {
	t.Helper()
	poll := time.NewTicker(r.start.Every())
	defer poll.Stop()
	for r.URL == "" {
		select {
		case addr := <-r.addr:
			r.URL = addr
		case <-r.done:
			t.Fatalf("replica %s exited before listening (%s):\n%s", r.name, r.cmd.ProcessState, r.logs())
		case now := <-poll.C:
			// An address printed by now wins over the tick: a replica
			// waited for long after its launch may have said it minutes
			// ago, and done nothing since.
			select {
			case addr := <-r.addr:
				r.URL = addr
				continue
			default:
			}
			if why := r.start.Check(now); why != "" {
				t.Fatalf("replica %s did not start listening %s; its goroutines' stacks (SIGQUIT) end its stderr:\n%s", r.name, why, r.quit())
			}
		}
	}
	waitFor(t, "replica "+r.name+" /healthz", readyTimeout, func() bool {
		select {
		case <-r.done:
			t.Fatalf("replica %s exited while starting (%s):\n%s", r.name, r.cmd.ProcessState, r.logs())
		default:
		}
		return r.healthy(hc)
	})
	return r
}

// healthy reports whether the replica's /healthz answers 200 (its database
// answers).
func (r *replica) healthy(hc *http.Client) bool {
	resp, err := hc.Get(r.URL + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startReplicas launches one replica per name with the same arguments and
// waits for all of them.
func startReplicas(t *testing.T, e *testEnv, args []string, names ...string) []*replica {
	t.Helper()
	rs := make([]*replica, len(names))
	for i, n := range names {
		rs[i] = launch(t, n, args...)
	}
	for _, r := range rs {
		r.ready(t, e.hc)
	}
	return rs
}

// kill SIGKILLs the replica and waits until it is reaped.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	r.expectExit.Store(true)
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("killing replica %s: %v", r.name, err)
	}
	r.waitExit(t)
}

// waitExit waits until the replica has exited and been reaped.
func (r *replica) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(exitTimeout):
		t.Fatalf("replica %s still running %s after it should have died", r.name, exitTimeout)
	}
}

// killedBySIGKILL reports whether the (reaped) replica died of SIGKILL.
func (r *replica) killedBySIGKILL() bool {
	ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// alive reports whether the process has not exited.
func (r *replica) alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

func (r *replica) log(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tail = append(r.tail, line)
	if !r.stacks && len(r.tail) > logTailLines {
		r.tail = r.tail[len(r.tail)-logTailLines:]
	}
}

// quit asks a replica that hangs for its goroutines' stacks (SIGQUIT makes
// a Go program print them and exit), waits for it to end, and returns its
// last lines with the stacks whole.
func (r *replica) quit() string {
	r.expectExit.Store(true)
	r.mu.Lock()
	r.stacks = true
	r.mu.Unlock()
	_ = r.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-r.done:
	case <-time.After(exitTimeout):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	return r.logs()
}

// quitted reports whether quit has run: the failure that called it showed
// the replica's stderr already.
func (r *replica) quitted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stacks
}

func (r *replica) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.tail, "\n")
}

// --- the service's API, as a client sees it ---

type account struct {
	ID       string `json:"id"`
	Balance  int64  `json:"balance"`
	Currency string `json:"currency"`
}

type payment struct {
	ID          string `json:"id"`
	AccountID   string `json:"account_id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description"`
	Status      string `json:"status"`
}

const currency = "KRW"

// call sends one request with the tenant's API key and decodes a JSON
// answer of the wanted status into out.
func (e *testEnv) call(t *testing.T, method, url string, body []byte, want int, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, "e2e-"+randHex(12))
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, url, resp.StatusCode, want, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s %s: decoding %s: %v", method, url, b, err)
	}
}

func (e *testEnv) createAccount(t *testing.T, base string, balance int64) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"balance": balance, "currency": currency})
	var a account
	e.call(t, http.MethodPost, base+"/v1/accounts", body, http.StatusCreated, &a)
	if a.ID == "" || a.Balance != balance {
		t.Fatalf("created account %+v, want balance %d", a, balance)
	}
	return a.ID
}

func (e *testEnv) balance(t *testing.T, base, accountID string) int64 {
	t.Helper()
	var a account
	e.call(t, http.MethodGet, base+"/v1/accounts/"+accountID, nil, http.StatusOK, &a)
	return a.Balance
}

// payments lists every payment of an account. The API pages only by limit,
// so a test keeps each account under the largest page.
func (e *testEnv) payments(t *testing.T, base, accountID string) []payment {
	t.Helper()
	var page struct {
		Data    []payment `json:"data"`
		HasMore bool      `json:"has_more"`
	}
	e.call(t, http.MethodGet, base+"/v1/accounts/"+accountID+"/payments?limit=1000", nil, http.StatusOK, &page)
	if page.HasMore {
		t.Fatalf("account %s has more than 1000 payments; keep test accounts smaller", accountID)
	}
	return page.Data
}

// paymentBody is a payment request whose description carries its key, so
// recorded payments can be matched to the keys that asked for them.
func paymentBody(accountID string, amount int64, key string) []byte {
	b, _ := json.Marshal(map[string]any{
		"account_id": accountID, "amount": amount, "currency": currency, "description": key,
	})
	return b
}

// paymentRequest builds POST /v1/payments with its key, and a fault when
// fault is not empty. GetBody is set, so idemhttp.RoundTripper can resend it.
func (e *testEnv) paymentRequest(ctx context.Context, base, key string, body []byte, fault string) *http.Request {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/payments", bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	if fault != "" {
		req.Header.Set("Idem-Fault", fault)
	}
	return req
}

// result is what a client finally got for one request.
type result struct {
	status    int
	replayed  bool
	paymentID string
	body      string
	err       error
}

func (r result) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%d (replayed %t) %s", r.status, r.replayed, strings.TrimSpace(r.body))
}

// do sends req with hc and reads the whole answer.
func do(hc *http.Client, req *http.Request) result {
	resp, err := hc.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{status: resp.StatusCode, err: fmt.Errorf("reading the answer: %w", err)}
	}
	res := result{status: resp.StatusCode, replayed: resp.Header.Get(idemhttp.HeaderReplayed) == "true", body: string(b)}
	if resp.StatusCode == http.StatusCreated {
		var p payment
		if err := json.Unmarshal(b, &p); err != nil {
			res.err = fmt.Errorf("decoding the payment %s: %w", b, err)
		}
		res.paymentID = p.ID
	}
	return res
}

// executions sums, over replicas, how many payment requests the idempotency
// middleware ran (rather than replayed), from their /metrics.
func (e *testEnv) executions(t *testing.T, replicas ...*replica) int {
	t.Helper()
	total := 0
	for _, r := range replicas {
		resp, err := e.hc.Get(r.URL + "/metrics")
		if err != nil {
			t.Fatalf("replica %s /metrics: %v", r.name, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("replica %s /metrics: status %d, %v", r.name, resp.StatusCode, err)
		}
		found := false
		for line := range strings.SplitSeq(string(b), "\n") {
			if !strings.HasPrefix(line, "idem_http_requests_total{") ||
				!strings.Contains(line, `middleware="payments"`) || !strings.Contains(line, `outcome="executed"`) {
				continue
			}
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				t.Fatalf("replica %s /metrics: %q: %v", r.name, line, err)
			}
			total += int(v)
			found = true
		}
		if !found {
			t.Fatalf("replica %s /metrics has no idem_http_requests_total{middleware=\"payments\",outcome=\"executed\"}", r.name)
		}
	}
	return total
}
