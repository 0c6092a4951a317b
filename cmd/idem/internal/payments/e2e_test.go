package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	keyA    = "sk_test_tenant_a"
	keyB    = "sk_test_tenant_b"
	tenantA = "tenant-a"
	tenantB = "tenant-b"
)

// manualClock is an idem.Clock that only moves when the test moves it.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var _ idem.Clock = (*manualClock)(nil)

// backend names where a test service keeps its data and its keys.
type backend string

const (
	// onSQLite: accounts, payments and keys in one SQLite file; every
	// payment commits with its key.
	onSQLite backend = "sqlite"
	// onPostgres: the same in a PostgreSQL schema.
	onPostgres backend = "postgres"
	// onPostgresRedis: the money in PostgreSQL, the keys in Redis: the
	// two-store form.
	onPostgresRedis backend = "postgres+redis"
	// onSQLiteRedis: the money in SQLite, the keys in Redis: the two-store
	// form on the embedded database.
	onSQLiteRedis backend = "sqlite+redis"
)

var allBackends = []backend{onSQLite, onPostgres, onPostgresRedis}

// forEachBackend runs test as a parallel subtest on each backend.
func forEachBackend(t *testing.T, backends []backend, test func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

// env is one service on a fresh database (and key prefix) behind a real
// HTTP server.
type env struct {
	t     *testing.T
	cfg   *payments.Config
	svc   *payments.Service
	srv   *httptest.Server
	clock *manualClock // nil with real clocks
	// keys is a store that sees the service's keys, for tests that look at
	// a key's state.
	keys idem.Store
}

// newEnv starts a service on SQLite.
func newEnv(t *testing.T, configure func(*payments.Config)) *env {
	t.Helper()
	return newEnvOn(t, onSQLite, configure)
}

// newEnvOn starts a service on backend b, whose stores decide key expiry
// by the env's manual clock.
func newEnvOn(t *testing.T, b backend, configure func(*payments.Config)) *env {
	t.Helper()
	return newEnvClocked(t, b, &manualClock{now: time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)}, configure)
}

// newEnvClocked starts a service on backend b with clock; nil means real
// clocks: the system's, and the servers' own for PostgreSQL and Redis.
func newEnvClocked(t *testing.T, b backend, clock *manualClock, configure func(*payments.Config)) *env {
	t.Helper()
	cfg := &payments.Config{
		APIKeys: map[string]string{keyA: tenantA, keyB: tenantB},
		Faults:  true,
	}
	var c idem.Clock
	if clock != nil {
		cfg.Clock, c = clock, clock
	}
	e := &env{t: t, clock: clock, cfg: cfg}
	openBackend(t, b, cfg, c, &e.keys)
	if configure != nil {
		configure(cfg)
	}
	e.start()
	return e
}

// replica starts another service on e's databases and stores, as a second
// replica behind a load balancer would be.
func (e *env) replica() *env {
	e.t.Helper()
	r := &env{t: e.t, clock: e.clock, cfg: e.cfg, keys: e.keys}
	r.start()
	return r
}

func (e *env) start() {
	t := e.t
	t.Helper()
	svc, err := payments.New(context.Background(), e.cfg)
	if err != nil {
		t.Fatalf("payments.New: %v", err)
	}
	t.Cleanup(func() {
		if err := svc.Close(); err != nil {
			t.Errorf("close service: %v", err)
		}
	})
	e.svc = svc
	e.srv = httptest.NewServer(svc.Handler())
	t.Cleanup(e.srv.Close)
}

// openBackend opens backend b's databases and stores, closed when the test
// ends, sets them in cfg, and sets *keys to a store that sees the keys.
func openBackend(t *testing.T, b backend, cfg *payments.Config, clock idem.Clock, keys *idem.Store) {
	t.Helper()
	switch b {
	case onSQLite:
		db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "payments.db"), nil)
		if err != nil {
			t.Fatalf("open db: %v", err)
		}
		t.Cleanup(func() {
			if err := db.Close(); err != nil {
				t.Errorf("close db: %v", err)
			}
		})
		cfg.DB = db
		store, err := idemsqlite.NewStore(context.Background(), db, &idemsqlite.StoreConfig{Clock: clock})
		if err != nil {
			t.Fatalf("idemsqlite.NewStore: %v", err)
		}
		*keys = store
	case onPostgres:
		db := payments.OpenPostgresForTest(t, clock)
		cfg.Postgres = db
		store, err := idempg.NewStore(context.Background(), db)
		if err != nil {
			t.Fatalf("idempg.NewStore: %v", err)
		}
		t.Cleanup(store.Close)
		*keys = store
	case onPostgresRedis:
		cfg.Postgres = payments.OpenPostgresForTest(t, clock)
		cfg.Keys = payments.OpenRedisKeysForTest(t, clock)
		*keys = cfg.Keys
	case onSQLiteRedis:
		db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "payments.db"), nil)
		if err != nil {
			t.Fatalf("open db: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		cfg.DB = db
		cfg.Keys = payments.OpenRedisKeysForTest(t, clock)
		*keys = cfg.Keys
	default:
		t.Fatalf("unknown backend %q", b)
	}
}

// req describes one request; zero fields are left out.
type req struct {
	method, path string
	apiKey       string // defaults to keyA; "-" sends no Authorization
	idemKey      string
	fault        string
	body         string
	header       map[string]string
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

func (e *env) newRequest(q req) *http.Request {
	e.t.Helper()
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	r, err := http.NewRequest(q.method, e.srv.URL+q.path, body)
	if err != nil {
		e.t.Fatalf("new request: %v", err)
	}
	switch q.apiKey {
	case "":
		r.Header.Set("Authorization", "Bearer "+keyA)
	case "-":
	default:
		r.Header.Set("Authorization", "Bearer "+q.apiKey)
	}
	if q.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if q.idemKey != "" {
		r.Header.Set("Idempotency-Key", q.idemKey)
	}
	if q.fault != "" {
		r.Header.Set(payments.HeaderFault, q.fault)
	}
	for k, v := range q.header {
		r.Header.Set(k, v)
	}
	return r
}

// send is safe to call from many goroutines: it reports failures with
// Errorf, never Fatalf.
func (e *env) send(q req) (resp, error) {
	res, err := e.srv.Client().Do(e.newRequest(q))
	if err != nil {
		return resp{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return resp{}, err
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}, nil
}

// sendAlone sends q on a connection of its own, for requests whose
// connection the server cuts: net/http's client transparently retries a
// request carrying an Idempotency-Key when a reused connection drops, which
// would hide the cut.
func (e *env) sendAlone(q req) (resp, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(e.newRequest(q))
	if err != nil {
		return resp{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}, err
}

func (e *env) do(q req) resp {
	e.t.Helper()
	r, err := e.send(q)
	if err != nil {
		e.t.Fatalf("%s %s: %v", q.method, q.path, err)
	}
	return r
}

func (e *env) expect(q req, status int) resp {
	e.t.Helper()
	r := e.do(q)
	if r.status != status {
		e.t.Fatalf("%s %s: got %s, want status %d", q.method, q.path, r, status)
	}
	return r
}

type account struct {
	ID        string    `json:"id"`
	Balance   int64     `json:"balance"`
	Currency  string    `json:"currency"`
	CreatedAt time.Time `json:"created_at"`
}

type payment struct {
	ID          string    `json:"id"`
	AccountID   string    `json:"account_id"`
	Amount      int64     `json:"amount"`
	Currency    string    `json:"currency"`
	Description string    `json:"description"`
	Status      string    `json:"status"`
	ChargeID    string    `json:"charge_id"`
	CreatedAt   time.Time `json:"created_at"`
}

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func decode[T any](t *testing.T, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r, err)
	}
	return v
}

func (e *env) createAccount(apiKey string, balance int64, currency string) account {
	e.t.Helper()
	r := e.expect(req{method: "POST", path: "/v1/accounts", apiKey: apiKey,
		body: fmt.Sprintf(`{"balance":%d,"currency":%q}`, balance, currency)}, http.StatusCreated)
	return decode[account](e.t, r)
}

func (e *env) account(apiKey, id string) account {
	e.t.Helper()
	return decode[account](e.t, e.expect(req{method: "GET", path: "/v1/accounts/" + id, apiKey: apiKey}, http.StatusOK))
}

func (e *env) payments(apiKey, accountID string) []payment {
	e.t.Helper()
	r := e.expect(req{method: "GET", path: "/v1/accounts/" + accountID + "/payments?limit=1000", apiKey: apiKey}, http.StatusOK)
	return decode[struct{ Data []payment }](e.t, r).Data
}

func payBody(accountID string, amount int64, currency string) string {
	return fmt.Sprintf(`{"account_id":%q,"amount":%d,"currency":%q,"description":"coffee"}`, accountID, amount, currency)
}

// expectProblem checks a problem+json answer and its type slug.
func expectProblem(t *testing.T, r resp, status int, typ string) problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("got %s, want status %d", r, status)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (%s)", ct, r)
	}
	p := decode[problem](t, r)
	if typ != "" && p.Type != typ {
		t.Fatalf("problem type = %q, want %q (%s)", p.Type, typ, r)
	}
	if p.Status != status || p.Title == "" {
		t.Fatalf("problem body incomplete: %s", r)
	}
	return p
}

func (e *env) expectBalance(apiKey, accountID string, want int64) {
	e.t.Helper()
	if got := e.account(apiKey, accountID).Balance; got != want {
		e.t.Fatalf("balance = %d, want %d", got, want)
	}
}

func (e *env) expectPayments(apiKey, accountID string, want int) []payment {
	e.t.Helper()
	list := e.payments(apiKey, accountID)
	if len(list) != want {
		e.t.Fatalf("%d payments recorded, want %d: %+v", len(list), want, list)
	}
	return list
}

// sendConcurrently sends n copies of q at once and returns the answers.
func (e *env) sendConcurrently(n int, q req) []resp {
	e.t.Helper()
	out := make([]resp, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i], errs[i] = e.send(q)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("request %d: %v", i, err)
		}
	}
	return out
}

func TestConcurrentDuplicatesMakeOnePayment(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")

		const n = 100
		answers := e.sendConcurrently(n, req{method: "POST", path: "/v1/payments", idemKey: "pay-once",
			fault: "delay=200ms", body: payBody(acct.ID, 700, "KRW")})

		replayed := 0
		for i, r := range answers {
			if r.status != http.StatusCreated {
				t.Fatalf("answer %d: %s, want 201", i, r)
			}
			if !bytes.Equal(r.body, answers[0].body) {
				t.Fatalf("answer %d differs:\n%s\n%s", i, r.body, answers[0].body)
			}
			if r.header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}
		if replayed != n-1 {
			t.Fatalf("%d answers replayed, want %d", replayed, n-1)
		}
		p := decode[payment](t, answers[0])
		list := e.expectPayments(keyA, acct.ID, 1)
		if list[0].ID != p.ID {
			t.Fatalf("recorded payment %s, answered %s", list[0].ID, p.ID)
		}
		e.expectBalance(keyA, acct.ID, 10_000-700)
	})
}

func TestMismatchIsRefusedInFlightAndAfter(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		first := req{method: "POST", path: "/v1/payments", idemKey: "same-key", fault: "delay=1s", body: payBody(acct.ID, 100, "KRW")}
		other := req{method: "POST", path: "/v1/payments", idemKey: "same-key", body: payBody(acct.ID, 999, "KRW")}

		type result struct {
			r   resp
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := e.send(first)
			done <- result{r, err}
		}()

		idemtest.Eventually(t, 5*time.Second, "the first request in flight", func() bool {
			return e.inFlight(tenantA, "same-key")
		})

		expectProblem(t, e.do(other), http.StatusUnprocessableEntity, "urn:idem:problem:idempotency-key-mismatch")

		res := <-done
		if res.err != nil {
			t.Fatalf("first request: %v", res.err)
		}
		if res.r.status != http.StatusCreated {
			t.Fatalf("first request: %s", res.r)
		}
		expectProblem(t, e.do(other), http.StatusUnprocessableEntity, "urn:idem:problem:idempotency-key-mismatch")

		first.fault = ""
		again := e.expect(first, http.StatusCreated)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, res.r.body) {
			t.Fatalf("the original request was not replayed: %s", again)
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 10_000-100)
	})
}

// inFlight reports whether a request holds the key. Where the middleware
// claims keys in the request's own transaction (idem.TxClaimer, PostgreSQL),
// nobody else sees the key until that commits: a claim that must wait for it
// tells, and the probe's own claim, should it win, is rolled back.
func (e *env) inFlight(tenant, key string) bool {
	e.t.Helper()
	// On a store that writes serially (SQLite) the middleware claims the
	// key with a write of its own, and Get sees it in flight; a TxClaimer
	// otherwise claims it in the handler's transaction, which only a
	// claim sees, waiting for it.
	sw, serial := e.keys.(idem.SerialWriter)
	if tc, ok := e.keys.(idem.TxClaimer); ok && !(serial && sw.WritesSerially()) {
		req := idem.ClaimRequest{Scope: idem.Scope(tenant), Key: idem.Key(key), Fingerprint: "probe",
			Lease: time.Minute, TTL: time.Hour}
		c, _, err := tc.ClaimTx(context.Background(), req, time.Millisecond,
			func(context.Context, idem.Claim) (idem.Response, bool, error) { return idem.Response{}, false, nil })
		if err != nil {
			e.t.Fatalf("ClaimTx probe: %v", err)
		}
		return c.Outcome == idem.InFlight
	}
	rec, err := e.keys.Get(context.Background(), idem.Scope(tenant), idem.Key(key))
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		e.t.Fatalf("store.Get: %v", err)
	}
	return err == nil && rec.State == idem.StateInFlight
}

func TestDropAfterCommitThenRetryReplays(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		q := req{method: "POST", path: "/v1/payments", idemKey: "lost-ack", fault: "drop-after-commit", body: payBody(acct.ID, 2_500, "KRW")}

		// A connection of its own: net/http's client transparently retries a
		// request carrying an Idempotency-Key when a reused connection drops,
		// which would hide the lost answer this test is about.
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Do(e.newRequest(q))
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			t.Fatalf("drop-after-commit answered %d %s; want the connection closed", res.StatusCode, b)
		}
		t.Logf("first attempt failed as intended: %v", err)

		// The work committed although the client saw nothing.
		list := e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 10_000-2_500)

		q.fault = ""
		retry := e.expect(q, http.StatusCreated)
		if retry.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry was not a replay: %v", retry.header)
		}
		if p := decode[payment](t, retry); p.ID != list[0].ID {
			t.Fatalf("retry answered payment %s, the one made is %s", p.ID, list[0].ID)
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 10_000-2_500)
	})
}

func TestFailBeforeCommitRollsBackAndRetryRuns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		q := req{method: "POST", path: "/v1/payments", idemKey: "transient", fault: "fail-before-commit", body: payBody(acct.ID, 4_000, "KRW")}

		r := e.do(q)
		expectProblem(t, r, http.StatusServiceUnavailable, "urn:idem:problem:temporarily-unavailable")
		if got := r.header.Get("Retry-After"); got != "1" {
			t.Fatalf("Retry-After = %q, want 1", got)
		}
		e.expectBalance(keyA, acct.ID, 10_000)
		e.expectPayments(keyA, acct.ID, 0)

		q.fault = ""
		ok := e.expect(q, http.StatusCreated)
		if ok.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the retry after a transient failure must run, not replay: %v", ok.header)
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 6_000)
	})
}

func TestFailBeforeCommitOnDeposit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 100, "USD")
		q := req{method: "POST", path: "/v1/accounts/" + acct.ID + "/deposits", idemKey: "dep", fault: "fail-before-commit", body: `{"amount":50}`}
		expectProblem(t, e.do(q), http.StatusServiceUnavailable, "urn:idem:problem:temporarily-unavailable")
		e.expectBalance(keyA, acct.ID, 100)
		q.fault = ""
		d := decode[struct {
			ID        string
			AccountID string `json:"account_id"`
			Amount    int64
			Balance   int64
		}](t, e.expect(q, http.StatusCreated))
		if !strings.HasPrefix(d.ID, "dep_") || d.AccountID != acct.ID || d.Amount != 50 || d.Balance != 150 {
			t.Fatalf("deposit = %+v", d)
		}
		e.expectBalance(keyA, acct.ID, 150)
	})
}

func TestInsufficientFundsIsReplayedAfterDeposit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 100, "EUR")
		pay := req{method: "POST", path: "/v1/payments", idemKey: "too-much", body: payBody(acct.ID, 500, "EUR")}

		first := e.do(pay)
		expectProblem(t, first, http.StatusPaymentRequired, "urn:idem:problem:insufficient-funds")

		e.expect(req{method: "POST", path: "/v1/accounts/" + acct.ID + "/deposits", idemKey: "top-up", body: `{"amount":1000}`}, http.StatusCreated)
		e.expectBalance(keyA, acct.ID, 1_100)

		again := e.do(pay)
		expectProblem(t, again, http.StatusPaymentRequired, "urn:idem:problem:insufficient-funds")
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Fatalf("the 402 was not replayed: %v %s", again.header, again.body)
		}
		e.expectPayments(keyA, acct.ID, 0)

		pay.idemKey = "new-attempt"
		e.expect(pay, http.StatusCreated)
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 600)
	})
}

func TestExpiredKeyExecutesAnew(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "JPY")
		q := req{method: "POST", path: "/v1/payments", idemKey: "daily", body: payBody(acct.ID, 1_000, "JPY")}

		p1 := decode[payment](t, e.expect(q, http.StatusCreated))
		e.clock.Advance(24*time.Hour - time.Second)
		replay := e.expect(q, http.StatusCreated)
		if replay.header.Get("Idempotent-Replayed") != "true" || decode[payment](t, replay).ID != p1.ID {
			t.Fatalf("within the TTL the key must replay: %s", replay)
		}

		e.clock.Advance(2 * time.Second) // 24h+1s after the claim
		fresh := e.expect(q, http.StatusCreated)
		if fresh.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("an expired key must execute anew: %v", fresh.header)
		}
		p2 := decode[payment](t, fresh)
		if p2.ID == p1.ID {
			t.Fatalf("the expired key replayed payment %s", p1.ID)
		}
		if !p2.CreatedAt.Equal(p1.CreatedAt.Add(24*time.Hour + time.Second)) {
			t.Fatalf("created_at %s does not follow the injected clock (first %s)", p2.CreatedAt, p1.CreatedAt)
		}
		list := e.expectPayments(keyA, acct.ID, 2)
		if list[0].ID != p2.ID || list[1].ID != p1.ID {
			t.Fatalf("payments not newest first: %+v", list)
		}
		e.expectBalance(keyA, acct.ID, 8_000)
	})
}

func TestTenantsNeverShareKeysOrData(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		a := e.createAccount(keyA, 10_000, "KRW")
		b := e.createAccount(keyB, 10_000, "KRW")

		pa := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", apiKey: keyA, idemKey: "shared-key",
			body: payBody(a.ID, 100, "KRW")}, http.StatusCreated))
		rb := e.expect(req{method: "POST", path: "/v1/payments", apiKey: keyB, idemKey: "shared-key",
			body: payBody(b.ID, 100, "KRW")}, http.StatusCreated)
		if rb.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("tenant B got a replay of tenant A's key")
		}
		pb := decode[payment](t, rb)
		if pb.ID == pa.ID || pb.AccountID != b.ID {
			t.Fatalf("tenant B's payment %+v, tenant A's %+v", pb, pa)
		}
		e.expectBalance(keyA, a.ID, 9_900)
		e.expectBalance(keyB, b.ID, 9_900)

		// Another tenant's data is indistinguishable from missing data.
		expectProblem(t, e.do(req{method: "GET", path: "/v1/accounts/" + a.ID, apiKey: keyB}), http.StatusNotFound, "urn:idem:problem:account-not-found")
		expectProblem(t, e.do(req{method: "GET", path: "/v1/accounts/" + a.ID + "/payments", apiKey: keyB}), http.StatusNotFound, "urn:idem:problem:account-not-found")
		expectProblem(t, e.do(req{method: "GET", path: "/v1/payments/" + pa.ID, apiKey: keyB}), http.StatusNotFound, "urn:idem:problem:payment-not-found")
		expectProblem(t, e.do(req{method: "POST", path: "/v1/payments", apiKey: keyB, idemKey: "steal",
			body: payBody(a.ID, 100, "KRW")}), http.StatusNotFound, "urn:idem:problem:account-not-found")
		expectProblem(t, e.do(req{method: "POST", path: "/v1/accounts/" + a.ID + "/deposits", apiKey: keyB, idemKey: "gift",
			body: `{"amount":5}`}), http.StatusNotFound, "urn:idem:problem:account-not-found")
		e.expectBalance(keyA, a.ID, 9_900)

		got := decode[payment](t, e.expect(req{method: "GET", path: "/v1/payments/" + pa.ID, apiKey: keyA}, http.StatusOK))
		if got != pa {
			t.Fatalf("GET payment = %+v, created %+v", got, pa)
		}
	})
}

func TestBadRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		good := payBody(acct.ID, 100, "KRW")
		long := strings.Repeat("k", 300)
		huge := `{"account_id":"` + acct.ID + `","amount":100,"currency":"KRW","description":"` + strings.Repeat("x", 10<<20) + `"}`

		tests := []struct {
			name   string
			q      req
			status int
			typ    string
		}{
			{"malformed JSON", req{idemKey: "k1", body: `{"account_id":`}, 400, "urn:idem:problem:invalid-request"},
			{"not an object", req{idemKey: "k2", body: `[1,2]`}, 400, "urn:idem:problem:invalid-request"},
			{"unknown field", req{idemKey: "k3", body: `{"account_id":"x","amount":1,"currency":"KRW","tip":5}`}, 400, "urn:idem:problem:invalid-request"},
			{"two values", req{idemKey: "k4", body: good + good}, 400, "urn:idem:problem:invalid-request"},
			{"amount not an integer", req{idemKey: "k5", body: `{"account_id":"x","amount":1.5,"currency":"KRW"}`}, 400, "urn:idem:problem:invalid-request"},
			{"empty body", req{idemKey: "k6"}, 400, "urn:idem:problem:invalid-request"},
			{"10 MB body", req{idemKey: "k7", body: huge}, 413, ""},
			{"300-character key", req{idemKey: long, body: good}, 400, "urn:idem:problem:idempotency-key-invalid"},
			{"missing key", req{body: good}, 400, "urn:idem:problem:idempotency-key-missing"},
			{"unknown fault", req{idemKey: "k8", body: good, fault: "explode"}, 400, "urn:idem:problem:invalid-fault"},
			{"negative amount", req{idemKey: "k9", body: payBody(acct.ID, -5, "KRW")}, 400, "urn:idem:problem:invalid-request"},
			{"lower-case currency", req{idemKey: "k10", body: payBody(acct.ID, 5, "krw")}, 400, "urn:idem:problem:invalid-request"},
		}
		for _, tt := range tests {
			tt.q.method, tt.q.path = "POST", "/v1/payments"
			r := e.do(tt.q)
			p := expectProblem(t, r, tt.status, tt.typ)
			if p.Detail == "" {
				t.Errorf("%s: no detail: %s", tt.name, r)
			}
		}
		e.expectBalance(keyA, acct.ID, 10_000)
		e.expectPayments(keyA, acct.ID, 0)

		// A 400 is not stored: the corrected request runs under the same key.
		fixes := []struct {
			name, bad string
			typ       string
		}{
			{"wrong currency", payBody(acct.ID, 100, "USD"), "urn:idem:problem:currency-mismatch"},
			{"amount 0", payBody(acct.ID, 0, "KRW"), "urn:idem:problem:invalid-request"},
		}
		for i, f := range fixes {
			key := fmt.Sprintf("fix-%d", i)
			expectProblem(t, e.do(req{method: "POST", path: "/v1/payments", idemKey: key, body: f.bad}), 400, f.typ)
			e.expectPayments(keyA, acct.ID, i)
			ok := e.expect(req{method: "POST", path: "/v1/payments", idemKey: key, body: good}, http.StatusCreated)
			if ok.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s: the corrected request was replayed", f.name)
			}
		}
		e.expectPayments(keyA, acct.ID, 2)
		e.expectBalance(keyA, acct.ID, 9_800)

		// A 404 is deterministic: stored and replayed.
		unknown := req{method: "POST", path: "/v1/payments", idemKey: "nowhere", body: payBody("acct_doesnotexist", 100, "KRW")}
		first := e.do(unknown)
		expectProblem(t, first, http.StatusNotFound, "urn:idem:problem:account-not-found")
		again := e.do(unknown)
		expectProblem(t, again, http.StatusNotFound, "urn:idem:problem:account-not-found")
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, first.body) {
			t.Fatalf("the 404 was not replayed: %v", again.header)
		}
	})
}

func TestUnsafeModeChargesEveryDuplicate(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, func(c *payments.Config) { c.Unsafe = true })
		acct := e.createAccount(keyA, 100_000, "KRW")

		const n = 20
		answers := e.sendConcurrently(n, req{method: "POST", path: "/v1/payments", idemKey: "pay-once",
			fault: "delay=300ms", body: payBody(acct.ID, 1_000, "KRW")})
		created := map[string]bool{}
		for i, r := range answers {
			if r.header.Get("Idem-Mode") != "unsafe" {
				t.Fatalf("answer %d lacks Idem-Mode: unsafe", i)
			}
			if r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("unsafe mode replayed an answer")
			}
			if r.status == http.StatusCreated {
				created[decode[payment](t, r).ID] = true
			}
		}
		if len(created) <= 1 {
			t.Fatalf("unsafe mode made %d payments from %d duplicates; the lab needs the double charge", len(created), n)
		}
		t.Logf("unsafe mode: %d duplicates made %d payments", n, len(created))
		list := e.expectPayments(keyA, acct.ID, len(created))
		for _, p := range list {
			if !created[p.ID] {
				t.Fatalf("recorded payment %s was never answered", p.ID)
			}
		}
		e.expectBalance(keyA, acct.ID, 100_000-int64(len(created))*1_000)
	})
}

func TestUnsafeModeBalanceNeverNegative(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, func(c *payments.Config) { c.Unsafe = true })
		acct := e.createAccount(keyA, 3_000, "KRW")
		answers := e.sendConcurrently(10, req{method: "POST", path: "/v1/payments",
			fault: "delay=100ms", body: payBody(acct.ID, 1_000, "KRW")})
		created, refused := 0, 0
		for _, r := range answers {
			switch r.status {
			case http.StatusCreated:
				created++
			case http.StatusPaymentRequired:
				refused++
			default:
				t.Fatalf("unexpected answer %s", r)
			}
		}
		if created != 3 || refused != 7 {
			t.Fatalf("%d created, %d refused; want 3 and 7", created, refused)
		}
		e.expectBalance(keyA, acct.ID, 0)
	})
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	acct := e.createAccount(keyA, 10, "KRW")
	tests := []struct {
		name string
		auth string
	}{
		{"no header", ""},
		{"wrong key", "Bearer sk_wrong"},
		{"a prefix of a key", "Bearer " + keyA[:len(keyA)-1]},
		{"wrong scheme", "Basic " + keyA},
		{"no key", "Bearer "},
	}
	for _, tt := range tests {
		q := req{method: "GET", path: "/v1/accounts/" + acct.ID, apiKey: "-"}
		if tt.auth != "" {
			q.header = map[string]string{"Authorization": tt.auth}
		}
		r := e.do(q)
		expectProblem(t, r, http.StatusUnauthorized, "urn:idem:problem:unauthorized")
		if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: WWW-Authenticate = %q", tt.name, r.header.Get("WWW-Authenticate"))
		}
	}
	r := e.do(req{method: "POST", path: "/v1/payments", apiKey: "-", idemKey: "k", body: payBody(acct.ID, 1, "KRW")})
	expectProblem(t, r, http.StatusUnauthorized, "urn:idem:problem:unauthorized")
	e.expectBalance(keyA, acct.ID, 10)
}

func TestAccountCreationTakesAnOptionalKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		q := req{method: "POST", path: "/v1/accounts", idemKey: "open-once", body: `{"balance":5,"currency":"GBP"}`}
		first := e.expect(q, http.StatusCreated)
		again := e.expect(q, http.StatusCreated)
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			t.Fatalf("account creation with a key was not replayed")
		}
		a := decode[account](t, first)
		if !strings.HasPrefix(a.ID, "acct_") || a.Balance != 5 || a.Currency != "GBP" || !a.CreatedAt.Equal(e.clock.Now()) {
			t.Fatalf("account = %+v", a)
		}
		if loc := first.header.Get("Location"); loc != "/v1/accounts/"+a.ID {
			t.Fatalf("Location = %q", loc)
		}
		q.idemKey = ""
		b := decode[account](t, e.expect(q, http.StatusCreated))
		if b.ID == a.ID {
			t.Fatalf("an account created without a key reused %s", a.ID)
		}
		expectProblem(t, e.do(req{method: "POST", path: "/v1/accounts", body: `{"currency":"gbp"}`}), 400, "urn:idem:problem:invalid-request")
		expectProblem(t, e.do(req{method: "POST", path: "/v1/accounts", body: `{"balance":-1,"currency":"GBP"}`}), 400, "urn:idem:problem:invalid-request")
		expectProblem(t, e.do(req{method: "POST", path: "/v1/accounts", body: `{"balance":1}`}), 400, "urn:idem:problem:invalid-request")
	})
}

func TestRoutingErrorsAreProblems(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	expectProblem(t, e.do(req{method: "GET", path: "/v1/nothing"}), 404, "urn:idem:problem:not-found")
	expectProblem(t, e.do(req{method: "GET", path: "/elsewhere"}), 404, "urn:idem:problem:not-found")
	r := e.do(req{method: "DELETE", path: "/v1/payments"})
	expectProblem(t, r, 405, "urn:idem:problem:method-not-allowed")
	if r.header.Get("Allow") != "POST" {
		t.Fatalf("Allow = %q", r.header.Get("Allow"))
	}
	expectProblem(t, e.do(req{method: "GET", path: "/v1/accounts/x/payments?limit=0"}), 400, "urn:idem:problem:invalid-request")
}

func TestFaultHeaderIgnoredWhenFaultsOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *payments.Config) { c.Faults = false })
	acct := e.createAccount(keyA, 1_000, "KRW")
	e.expect(req{method: "POST", path: "/v1/payments", idemKey: "k", fault: "fail-before-commit,explode",
		body: payBody(acct.ID, 10, "KRW")}, http.StatusCreated)
	e.expectBalance(keyA, acct.ID, 990)
}

func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	forEachBackend(t, allBackends, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		r := e.expect(req{method: "GET", path: "/healthz", apiKey: "-"}, http.StatusOK)
		if !strings.Contains(string(r.body), "ok") {
			t.Fatalf("healthz: %s", r)
		}
		acct := e.createAccount(keyA, 1_000, "KRW")
		q := req{method: "POST", path: "/v1/payments", idemKey: "m", body: payBody(acct.ID, 10, "KRW")}
		e.expect(q, http.StatusCreated)
		e.expect(q, http.StatusCreated)

		m := string(e.expect(req{method: "GET", path: "/metrics", apiKey: "-"}, http.StatusOK).body)
		for _, want := range []string{
			`idem_http_requests_total{middleware="payments",outcome="executed"} 1`,
			`idem_http_requests_total{middleware="payments",outcome="replayed"} 1`,
			`payments_created_total 1`,
			`payments_accounts 1`,
		} {
			if !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if t.Failed() {
			t.Logf("/metrics:\n%s", m)
		}
	})
}

func TestUnsafeModeLostAcknowledgementChargesTwice(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, func(c *payments.Config) { c.Unsafe = true })
		acct := e.createAccount(keyA, 10_000, "KRW")
		q := req{method: "POST", path: "/v1/payments", idemKey: "lost-ack", fault: "drop-after-commit", body: payBody(acct.ID, 2_500, "KRW")}
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		if res, err := (&http.Client{Transport: tr}).Do(e.newRequest(q)); err == nil {
			res.Body.Close()
			t.Fatalf("drop-after-commit answered %d; want the connection closed", res.StatusCode)
		}
		q.fault = ""
		e.expect(q, http.StatusCreated)
		e.expectPayments(keyA, acct.ID, 2)
		e.expectBalance(keyA, acct.ID, 5_000)
	})
}

func TestUnsafeModeWarnsAndStillValidates(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	e := newEnv(t, func(c *payments.Config) {
		c.Unsafe = true
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "UNSAFE MODE") {
		t.Fatalf("New in unsafe mode logged %q; want a loud warning", out)
	}
	acct := e.createAccount(keyA, 1_000, "KRW")
	big := `{"account_id":"` + acct.ID + `","amount":1,"currency":"KRW","description":"` + strings.Repeat("x", 2<<20) + `"}`
	r := e.do(req{method: "POST", path: "/v1/payments", body: big})
	expectProblem(t, r, http.StatusRequestEntityTooLarge, "urn:idem:problem:body-too-large")
	expectProblem(t, e.do(req{method: "POST", path: "/v1/payments", body: `{"account_id":`}), 400, "urn:idem:problem:invalid-request")
	expectProblem(t, e.do(req{method: "POST", path: "/v1/payments", body: payBody(acct.ID, 5_000, "KRW")}), 402, "urn:idem:problem:insufficient-funds")
	e.expectBalance(keyA, acct.ID, 1_000)
	e.expectPayments(keyA, acct.ID, 0)
}
