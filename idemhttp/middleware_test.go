package idemhttp_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend is a store the middleware is tested on.
type backend struct {
	name  string
	open  func(t *testing.T, clock idem.Clock) idem.Store
	tx    bool
	sqlDB func(s idem.Store) *idemsqlite.DB
}

var sqliteDBs sync.Map // *idemsqlite.Store -> *idemsqlite.DB

func backends() []backend {
	return []backend{
		{name: "mem", open: func(t *testing.T, clock idem.Clock) idem.Store {
			return idemmem.NewStore(&idemmem.Config{Clock: clock})
		}},
		{name: "sqlite", tx: true, open: openSQLite},
		// The same-transaction form without the claim in it: the store's
		// CompleteTx alone, as a TxStore that is not a TxClaimer offers.
		{name: "sqlite-completetx", tx: true, open: func(t *testing.T, clock idem.Clock) idem.Store {
			return completeTxOnly{openSQLite(t, clock).(*idemsqlite.Store)}
		}},
	}
}

// completeTxOnly is a TxStore that does not claim in its transactions.
type completeTxOnly struct{ s *idemsqlite.Store }

func (c completeTxOnly) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	return c.s.Claim(ctx, req)
}
func (c completeTxOnly) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	return c.s.Complete(ctx, ref, resp)
}
func (c completeTxOnly) Release(ctx context.Context, ref idem.Ref) error {
	return c.s.Release(ctx, ref)
}
func (c completeTxOnly) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	return c.s.Get(ctx, scope, key)
}
func (c completeTxOnly) Purge(ctx context.Context, limit int) (int, error) {
	return c.s.Purge(ctx, limit)
}
func (c completeTxOnly) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	return c.s.CompleteTx(ctx, ref, work)
}

func openSQLite(t *testing.T, clock idem.Clock) idem.Store {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := idemsqlite.NewStore(context.Background(), db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	sqliteDBs.Store(s, db)
	return s
}

// spyStore counts what the middleware asks of a store and can fail on demand.
type spyStore struct {
	idem.Store
	inflight     atomic.Int64
	fail         atomic.Bool
	claims, gets atomic.Int64
	replays      atomic.Int64
	replayer     idem.Replayer // the wrapped store's, if it has one
}

// reads counts the reads of records: Gets and Replays.
func (s *spyStore) reads() int64 { return s.gets.Load() + s.replays.Load() }

func (s *spyStore) replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	s.replays.Add(1)
	return s.replayer.Replay(ctx, scope, key, fp)
}

func (s *spyStore) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, scope, key)
}

func (s *spyStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	s.claims.Add(1)
	if s.fail.Load() {
		return idem.Claim{}, errors.New("connection refused")
	}
	c, err := s.Store.Claim(ctx, req)
	if err == nil && c.Outcome == idem.InFlight {
		s.inflight.Add(1)
	}
	return c, err
}

// txSpy keeps the TxStore face of a wrapped TxStore.
type txSpy struct {
	*spyStore
	tx idem.TxStore
}

func (s *txSpy) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	return s.tx.CompleteTx(ctx, ref, work)
}

// txReplaySpy keeps the Replayer face of a wrapped TxStore too.
type txReplaySpy struct{ *txSpy }

func (s txReplaySpy) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	return s.spyStore.replay(ctx, scope, key, fp)
}

// spy wraps s, keeping its TxStore and Replayer faces (not its
// TxClaimer's: the middleware claims through Claim).
func spy(s idem.Store) (idem.Store, *spyStore) {
	sp := &spyStore{Store: s}
	sp.replayer, _ = s.(idem.Replayer)
	ts, isTx := s.(idem.TxStore)
	switch {
	case isTx && sp.replayer != nil:
		return txReplaySpy{&txSpy{spyStore: sp, tx: ts}}, sp
	case isTx:
		return &txSpy{spyStore: sp, tx: ts}, sp
	case sp.replayer != nil:
		return replaySpy{sp}, sp
	}
	return sp, sp
}

// replaySpy is a spyStore that keeps a Replayer face.
type replaySpy struct{ *spyStore }

func (s replaySpy) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	return s.spyStore.replay(ctx, scope, key, fp)
}

type result struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, h http.Handler, method, target, key, body string, hdr ...string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return result{rr.Code, rr.Result().Header, rr.Body.String()}
}

func problemType(t *testing.T, r result) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != idemhttp.ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q (body %s)", ct, idemhttp.ProblemContentType, r.body)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Title  string `json:"title"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status || p.Title == "" {
		t.Fatalf("problem %+v does not match status %d", p, r.status)
	}
	return p.Type
}

func newMiddleware(t *testing.T, cfg idemhttp.Config) *idemhttp.Middleware {
	t.Helper()
	m, err := idemhttp.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// counter is a handler that counts executions and answers 201 with its
// execution number, a cookie and a custom header.
func counter(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/things/%d", i))
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Private", "no")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d}`, i)
	})
}

func forEachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

func TestRequestValidation(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var n atomic.Int64
		m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{}), MaxBodyBytes: 64})
		h := m.Handler(counter(&n))
		tests := []struct {
			name, method, key, body string
			hdr                     []string
			status                  int
			problem                 string
		}{
			{"missing key", "POST", "", `{}`, nil, 400, idemhttp.ProblemKeyMissing},
			{"key too long", "POST", strings.Repeat("a", 256), `{}`, nil, 400, idemhttp.ProblemKeyInvalid},
			{"key with space", "POST", "a b", `{}`, nil, 400, idemhttp.ProblemKeyInvalid},
			{"unterminated quoted key", "POST", `"abc`, `{}`, nil, 400, idemhttp.ProblemKeyInvalid},
			{"body too large", "POST", "k-large", strings.Repeat("x", 65), nil, 413, idemhttp.ProblemBodyTooLarge},
		}
		for _, tc := range tests {
			r := do(t, h, tc.method, "/pay", tc.key, tc.body, tc.hdr...)
			if r.status != tc.status {
				t.Errorf("%s: status %d, want %d (%s)", tc.name, r.status, tc.status, r.body)
				continue
			}
			if got := problemType(t, r); got != tc.problem {
				t.Errorf("%s: problem type %q, want %q", tc.name, got, tc.problem)
			}
		}
		if n.Load() != 0 {
			t.Fatalf("handler ran %d times for invalid requests; want 0", n.Load())
		}
		// Nothing was stored: the same key now executes.
		if r := do(t, h, "POST", "/pay", "k-large", `{}`); r.status != 201 {
			t.Fatalf("after 413, status %d", r.status)
		}
		// The middleware's own rejections are counted, nothing else.
		c := m.Counts()
		if c[idemhttp.OutcomeRejected] != uint64(len(tests)) || c[idemhttp.OutcomeExecuted] != 1 {
			t.Fatalf("counts %v", c)
		}
	})
}

func TestTwoKeyHeadersRejected(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)}).Handler(counter(&n))
	req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
	req.Header.Add(idemhttp.HeaderKey, "a")
	req.Header.Add(idemhttp.HeaderKey, "b")
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != 400 || n.Load() != 0 {
		t.Fatalf("status %d, executions %d", rr.Code, n.Load())
	}
}

func TestPassThrough(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Optional: true}).Handler(counter(&n))
	for i := 0; i < 2; i++ {
		if r := do(t, h, "GET", "/x", "", ""); r.status != 201 { // GET is not protected
			t.Fatalf("GET status %d", r.status)
		}
		if r := do(t, h, "POST", "/x", "", "{}"); r.status != 201 || r.header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("optional POST without key: %d %v", r.status, r.header)
		}
	}
	if n.Load() != 4 {
		t.Fatalf("executions %d, want 4", n.Load())
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{})}).Handler(counter(&n))
		first := do(t, h, "POST", "/pay?b=2&a=1", "key-1", `{"amount": 100, "currency": "KRW"}`)
		if first.status != 201 || first.header.Get(idemhttp.HeaderReplayed) != "" || first.header.Get("Set-Cookie") == "" {
			t.Fatalf("first: %+v", first)
		}
		// The same request re-serialised, with its query reordered, and the
		// key in its structured-field form.
		again := do(t, h, "POST", "/pay?a=1&b=2", `"key-1"`, `{"currency":"KRW","amount":100}`)
		if again.status != 201 || again.body != first.body {
			t.Fatalf("replay: %+v, first %+v", again, first)
		}
		if again.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("replay lacks %s: %v", idemhttp.HeaderReplayed, again.header)
		}
		if again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Content-Type") != "application/json" {
			t.Fatalf("replayed headers %v", again.header)
		}
		if again.header.Get("Set-Cookie") != "" || again.header.Get("X-Private") != "" {
			t.Fatalf("replay leaked headers outside the allow-list: %v", again.header)
		}
		if n.Load() != 1 {
			t.Fatalf("executions %d, want 1", n.Load())
		}
	})
}

// A duplicate of a key this process saw completed, its answer no longer
// in memory (here MemoryReplayFor is off), is answered from one read of
// the record, without a claim; one it did not see (another process's, or
// with RecentKeys off) is claimed and answered from the claim. Either way
// it is the same answer.
func TestRecentKeysAnsweredWithOneRead(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		store, sp := spy(b.open(t, idem.SystemClock{}))
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, MemoryReplayFor: -1}).Handler(counter(&n))
		first := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
		if first.status != 201 || sp.claims.Load() != 1 || sp.reads() != 0 {
			t.Fatalf("first: %+v, %d claims, %d reads; want 201 after one claim", first, sp.claims.Load(), sp.reads())
		}
		again := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
		if again.status != 201 || again.body != first.body || again.header.Get(idemhttp.HeaderReplayed) != "true" ||
			again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Set-Cookie") != "" {
			t.Fatalf("replay from the record: %+v, first %+v", again, first)
		}
		if sp.claims.Load() != 1 || sp.reads() != 1 {
			t.Errorf("replay: %d claims, %d reads in all; want the first's claim and one read", sp.claims.Load(), sp.reads())
		}
		// A store that reads replays narrowly is read through Replay.
		if _, ok := store.(idem.Replayer); ok && sp.replays.Load() != 1 {
			t.Errorf("replay: %d Replays, %d Gets of a Replayer; want the read to be a Replay", sp.replays.Load(), sp.gets.Load())
		}
		if r := do(t, h, "POST", "/pay", "k-1", `{"amount":999}`); r.status != 422 || problemType(t, r) != idemhttp.ProblemKeyMismatch {
			t.Errorf("another body under a recent key: %+v, want 422", r)
		}
		if sp.claims.Load() != 1 {
			t.Errorf("%d claims after the mismatch, want 1: a recent key's record answers it", sp.claims.Load())
		}

		// Another process sharing the store, and one that remembers
		// nothing, claim the key: the claim answers with the same replay.
		for _, cfg := range []idemhttp.Config{{SharedScope: true, Store: store}, {SharedScope: true, Store: store, RecentKeys: -1}} {
			before := sp.claims.Load()
			other := newMiddleware(t, cfg).Handler(counter(&n))
			r := do(t, other, "POST", "/pay", "k-1", `{"amount":100}`)
			if r.status != 201 || r.body != first.body || r.header.Get(idemhttp.HeaderReplayed) != "true" {
				t.Errorf("RecentKeys %d, replay from the claim: %+v", cfg.RecentKeys, r)
			}
			if sp.claims.Load() != before+1 {
				t.Errorf("RecentKeys %d: %d claims for a key it never saw, want 1", cfg.RecentKeys, sp.claims.Load()-before)
			}
		}
		if n.Load() != 1 {
			t.Errorf("%d executions, want 1", n.Load())
		}
	})
}

// TestMemoryReplay: a duplicate reaching the process that completed its
// key within MemoryReplayFor is answered from memory, with no read of the
// store, and with the answer the store would give; another request under
// the key is still refused from the store's record. Past MemoryReplayFor
// the store answers, and past the TTL the request runs again.
func TestMemoryReplay(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		store, sp := spy(b.open(t, clock))
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Clock: clock, TTL: time.Hour}).Handler(counter(&n))
		first := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
		other := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Clock: clock, MemoryReplayFor: -1, RecentKeys: -1}).Handler(counter(&n))
		fromStore := do(t, other, "POST", "/pay", "k-1", `{"amount":100}`)
		claims, reads := sp.claims.Load(), sp.reads()

		clock.Advance(9 * time.Second)
		again := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
		if again.status != first.status || again.body != first.body || !reflect.DeepEqual(again.header, fromStore.header) {
			t.Errorf("replay from memory: %+v\nfrom the store: %+v", again, fromStore)
		}
		if sp.claims.Load() != claims || sp.reads() != reads {
			t.Errorf("replay from memory: %d claims, %d reads of the store; want none", sp.claims.Load()-claims, sp.reads()-reads)
		}
		if r := do(t, h, "POST", "/pay", "k-1", `{"amount":999}`); r.status != 422 || problemType(t, r) != idemhttp.ProblemKeyMismatch {
			t.Errorf("another body under a key in memory: %+v, want 422", r)
		}

		clock.Advance(time.Second) // MemoryReplayFor (10s) has passed
		reads = sp.reads()
		if r := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`); r.body != first.body || r.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Errorf("replay past MemoryReplayFor: %+v", r)
		}
		if sp.reads() != reads+1 {
			t.Errorf("replay past MemoryReplayFor: %d reads of the store, want 1", sp.reads()-reads)
		}
		clock.Advance(time.Hour)
		if r := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`); r.body != `{"execution":2}` {
			t.Errorf("past the TTL: %+v, want a second execution", r)
		}
		if n.Load() != 2 {
			t.Errorf("%d executions, want 2", n.Load())
		}
	})
}

func TestConfiguredReplayHeaders(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), ReplayHeaders: []string{"x-private"}}).Handler(counter(&n))
	do(t, h, "POST", "/pay", "k", "{}")
	r := do(t, h, "POST", "/pay", "k", "{}")
	if r.header.Get("X-Private") != "no" {
		t.Fatalf("configured header not replayed: %v", r.header)
	}
	for _, bad := range []string{"set-cookie", "Authorization", "WWW-Authenticate"} {
		if _, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), ReplayHeaders: []string{bad}}); err == nil {
			t.Errorf("ReplayHeaders %q accepted; want an error", bad)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*idemhttp.Config{
		"nil":             nil,
		"no store":        {},
		"no scope":        {Store: idemmem.NewStore(nil)},
		"negative ttl":    {SharedScope: true, Store: idemmem.NewStore(nil), TTL: -time.Second},
		"ttl below lease": {SharedScope: true, Store: idemmem.NewStore(nil), TTL: time.Second, Lease: time.Minute},
		"negative body":   {SharedScope: true, Store: idemmem.NewStore(nil), MaxBodyBytes: -1},
	} {
		if _, err := idemhttp.New(cfg); err == nil {
			t.Errorf("%s: New succeeded; want an error", name)
		}
	}
}

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		store, sp := spy(b.open(t, idem.SystemClock{}))
		const N = 50
		var n atomic.Int64
		entered := make(chan struct{})
		release := make(chan struct{})
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered) // a second execution would panic here
			<-release
			counter(&n).ServeHTTP(w, r)
		})
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, InflightWait: time.Minute}).Handler(slow)
		results := make(chan result, N)
		var wg sync.WaitGroup
		for i := 0; i < N; i++ {
			wg.Go(func() { results <- do(t, h, "POST", "/pay", "same", `{"amount":1}`) })
		}
		<-entered
		// Let the first finish once every duplicate has seen it in flight.
		waitFor(t, func() bool { return sp.inflight.Load() >= N-1 })
		close(release)
		wg.Wait()
		close(results)
		var replayed int
		for r := range results {
			if r.status != 201 || r.body != `{"execution":1}` {
				t.Fatalf("answer %+v", r)
			}
			if r.header.Get(idemhttp.HeaderReplayed) == "true" {
				replayed++
			}
		}
		if n.Load() != 1 || replayed != N-1 {
			t.Fatalf("executions %d, replayed %d; want 1 and %d", n.Load(), replayed, N-1)
		}
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	idemtest.Eventually(t, 20*time.Second, "the condition", cond)
}

func TestInFlightConflictAndMismatch(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var n atomic.Int64
		entered := make(chan struct{})
		release := make(chan struct{})
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			counter(&n).ServeHTTP(w, r)
		})
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{}), InflightWait: 30 * time.Millisecond}).Handler(slow)
		done := make(chan result)
		go func() { done <- do(t, h, "POST", "/pay", "k", `{"amount":1}`) }()
		<-entered

		r := do(t, h, "POST", "/pay", "k", `{"amount":1}`)
		if r.status != 409 || r.header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemInFlight {
			t.Fatalf("duplicate in flight: %+v", r)
		}
		r = do(t, h, "POST", "/pay", "k", `{"amount":2}`)
		if r.status != 422 || problemType(t, r) != idemhttp.ProblemKeyMismatch {
			t.Fatalf("mismatch in flight: %+v", r)
		}
		r = do(t, h, "PATCH", "/pay", "k", `{"amount":1}`)
		if r.status != 422 {
			t.Fatalf("same key, other method: %+v", r)
		}
		close(release)
		if first := <-done; first.status != 201 {
			t.Fatalf("first: %+v", first)
		}
		r = do(t, h, "POST", "/pay", "k", `{"amount":2}`)
		if r.status != 422 {
			t.Fatalf("mismatch after completion: %+v", r)
		}
		if n.Load() != 1 {
			t.Fatalf("executions %d", n.Load())
		}
	})
}

func TestFailuresAreClassified(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{})}).Handler(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := n.Add(1)
				switch r.URL.Path {
				case "/5xx":
					if i == 1 {
						http.Error(w, "database timeout", http.StatusServiceUnavailable)
						return
					}
				case "/panic":
					if i == 1 {
						panic("boom")
					}
				case "/429":
					if i == 1 {
						w.WriteHeader(http.StatusTooManyRequests)
						return
					}
				case "/402":
					w.WriteHeader(http.StatusPaymentRequired)
					fmt.Fprintf(w, "insufficient funds %d", i)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "ok %d", i)
			}))
		for _, path := range []string{"/5xx", "/panic", "/429"} {
			n.Store(0)
			first := do(t, h, "POST", path, "key"+path, "{}")
			if first.status < 400 {
				t.Fatalf("%s first: %+v", path, first)
			}
			if path == "/panic" && (first.status != 500 || problemType(t, first) != idemhttp.ProblemHandlerFailed) {
				t.Fatalf("panic answered %+v", first)
			}
			retry := do(t, h, "POST", path, "key"+path, "{}")
			if retry.status != 201 || retry.body != "ok 2" || retry.header.Get(idemhttp.HeaderReplayed) != "" {
				t.Fatalf("%s retry did not run again: %+v", path, retry)
			}
		}
		n.Store(0)
		first := do(t, h, "POST", "/402", "k402", "{}")
		again := do(t, h, "POST", "/402", "k402", "{}")
		if first.status != 402 || again.status != 402 || again.body != "insufficient funds 1" || again.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("402 not replayed: %+v then %+v", first, again)
		}
	})
}

func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		store, sp := spy(b.open(t, idem.SystemClock{}))
		sp.fail.Store(true)
		var n atomic.Int64
		m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store})
		r := do(t, m.Handler(counter(&n)), "POST", "/pay", "k", "{}")
		if r.status != 503 || r.header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemStoreUnavailable {
			t.Fatalf("store down: %+v", r)
		}
		if n.Load() != 0 {
			t.Fatal("handler ran without protection while the store was down")
		}
		if m.Counts()[idemhttp.OutcomeStoreError] != 1 {
			t.Fatalf("counts %v", m.Counts())
		}
		sp.fail.Store(false)
		if r := do(t, m.Handler(counter(&n)), "POST", "/pay", "k", "{}"); r.status != 201 || n.Load() != 1 {
			t.Fatalf("after recovery: %+v", r)
		}
	})
}

func TestScopesIsolateKeys(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{
			Store: b.open(t, idem.SystemClock{}),
			Scope: func(r *http.Request) (idem.Scope, error) {
				if v := r.Header.Get("X-Tenant"); v != "" {
					return idem.Scope(v), nil
				}
				return "", errors.New("no tenant")
			},
		}).Handler(counter(&n))
		a := do(t, h, "POST", "/pay", "k", "{}", "X-Tenant", "a")
		b2 := do(t, h, "POST", "/pay", "k", "{}", "X-Tenant", "b")
		if a.body == b2.body || b2.header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("tenant b got tenant a's answer: %+v %+v", a, b2)
		}
		if r := do(t, h, "POST", "/pay", "k", "{}"); r.status != 400 || problemType(t, r) != idemhttp.ProblemScope {
			t.Fatalf("no scope: %+v", r)
		}
	})
}

func TestTTLExpiry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, clock), TTL: time.Hour}).Handler(counter(&n))
		do(t, h, "POST", "/pay", "k", "{}")
		clock.Advance(59 * time.Minute)
		if r := do(t, h, "POST", "/pay", "k", "{}"); r.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("replay before expiry: %+v", r)
		}
		clock.Advance(2 * time.Minute)
		if r := do(t, h, "POST", "/pay", "k", "{}"); r.body != `{"execution":2}` {
			t.Fatalf("after expiry: %+v", r)
		}
	})
}

// TestLeaseTakeoverFencing: an execution that outlives its lease is taken
// over by a retry; its late completion is refused, and with the
// same-transaction form its effect is rolled back.
func TestLeaseTakeoverFencing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		store := b.open(t, clock)
		if _, ok := store.(idem.TxClaimer); ok {
			t.Skip("a TxClaimer claims in the handler's own transaction, which nobody can take over: no lease to outlive")
		}
		var logs bytes.Buffer
		var logMu sync.Mutex
		logger := slog.New(slog.NewTextHandler(lockedWriter{&logs, &logMu}, nil))
		var n atomic.Int64
		entered := make(chan int64, 2)
		release := make(chan struct{})
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Lease: 2 * time.Minute, InflightWait: -1, Logger: logger}).Handler(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := n.Add(1)
				entered <- i
				if i == 1 {
					<-release
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "execution %d", i)
			}))
		first := make(chan result)
		go func() { first <- do(t, h, "POST", "/pay", "secret-key-123", "{}") }()
		<-entered
		clock.Advance(3 * time.Minute) // the first execution's lease ends
		second := do(t, h, "POST", "/pay", "secret-key-123", "{}")
		if second.status != 201 || second.body != "execution 2" {
			t.Fatalf("takeover: %+v", second)
		}
		close(release)
		r1 := <-first
		if b.tx {
			if r1.status != 503 || problemType(t, r1) != idemhttp.ProblemLeaseLost {
				t.Fatalf("late execution with the same-transaction form: %+v", r1)
			}
		} else if r1.status != 201 {
			t.Fatalf("late execution: %+v", r1)
		}
		if r := do(t, h, "POST", "/pay", "secret-key-123", "{}"); r.body != "execution 2" {
			t.Fatalf("replay after takeover: %+v", r)
		}
		logMu.Lock()
		defer logMu.Unlock()
		if !strings.Contains(logs.String(), "lease") {
			t.Fatalf("lease loss not logged: %s", logs.String())
		}
		if strings.Contains(logs.String(), "secret-key-123") {
			t.Fatalf("key leaked into the logs: %s", logs.String())
		}
	})
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestLargeResponses(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var n atomic.Int64
		big := strings.Repeat("x", 100)
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{}), MaxResponseBytes: 64}).Handler(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, big[:50])
				io.WriteString(w, big[50:])
			}))
		first := do(t, h, "POST", "/pay", "k", "{}")
		if b.tx {
			// Nothing reaches the client before commit, and a truncated
			// answer is never kept: the transaction is rolled back.
			if first.status != 500 || problemType(t, first) != idemhttp.ProblemResponseTooLarge {
				t.Fatalf("tx: %+v", first)
			}
			if r := do(t, h, "POST", "/pay", "k", "{}"); r.status != 500 || n.Load() != 2 {
				t.Fatalf("tx retry should run again: %+v, executions %d", r, n.Load())
			}
			return
		}
		if first.status != 201 || first.body != big {
			t.Fatalf("first caller must get the whole answer: %+v", first)
		}
		r := do(t, h, "POST", "/pay", "k", "{}")
		if r.status != 201 || r.body != "" || r.header.Get(idemhttp.HeaderBodyOmitted) != "true" || r.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("replay of an omitted body: %+v", r)
		}
		if n.Load() != 1 {
			t.Fatalf("executions %d", n.Load())
		}
	})
}

func TestFlushAndUnwrap(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		var flushErr, unwrapOK atomic.Value
		h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{})}).Handler(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "part")
				flushErr.Store(fmt.Sprint(http.NewResponseController(w).Flush()))
				_, ok := w.(interface{ Unwrap() http.ResponseWriter })
				unwrapOK.Store(ok)
			}))
		req := httptest.NewRequest("POST", "/s", strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderKey, "k")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		if flushErr.Load() != "<nil>" || unwrapOK.Load() != true {
			t.Fatalf("Flush error %v, Unwrap %v", flushErr.Load(), unwrapOK.Load())
		}
		if !rr.Flushed || rr.Code != 201 || rr.Body.String() != "part" {
			t.Fatalf("flushed %v, code %d, body %q", rr.Flushed, rr.Code, rr.Body.String())
		}
	})
}

func TestKeyFromContext(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	h := newMiddleware(t, idemhttp.Config{Store: idemmem.NewStore(nil), Scope: func(*http.Request) (idem.Scope, error) { return "t1", nil }}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s, k, ok := idemhttp.KeyFromContext(r.Context())
			got.Store(fmt.Sprint(s, "/", k, "/", ok))
		}))
	do(t, h, "POST", "/", "abc", "{}")
	if got.Load() != "t1/abc/true" {
		t.Fatalf("KeyFromContext = %v", got.Load())
	}
}

// TestSameTransaction: with a TxStore, the handler's writes commit with the
// key, and a failed execution leaves neither.
func TestSameTransaction(t *testing.T) {
	t.Parallel()
	store := openSQLite(t, idem.SystemClock{})
	v, _ := sqliteDBs.Load(store)
	db := v.(*idemsqlite.DB)
	ctx := context.Background()
	if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE charges (key TEXT)`); err != nil {
		t.Fatal(err)
	}
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges VALUES (?)`, r.Header.Get(idemhttp.HeaderKey))
			return err
		})
		if err != nil || r.URL.Path == "/fail" {
			http.Error(w, "failed after writing", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	do(t, h, "POST", "/ok", "a", "{}")
	do(t, h, "POST", "/fail", "b", "{}")
	do(t, h, "POST", "/ok", "a", "{}")
	var keys []string
	rows, err := db.Reader().QueryContext(ctx, `SELECT key FROM charges ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		rows.Scan(&k)
		keys = append(keys, k)
	}
	if fmt.Sprint(keys) != "[a]" {
		t.Fatalf("charges %v, want [a]", keys)
	}
	if _, err := store.Get(ctx, "", "b"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("failed key b: %v, want ErrNotFound (released)", err)
	}
}

// TestAbortLeavesKeyToLease: a handler that cuts the connection is treated
// like a crash. Outside a shared transaction its effect may have happened,
// so the key stays in flight until its lease ends; inside one, the effect
// was rolled back and the key is released.
func TestAbortLeavesKeyToLease(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, b backend) {
		store := b.open(t, idem.SystemClock{})
		m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store})
		var ex atomic.Value
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e, _ := idemhttp.ExecutionFromContext(r.Context())
			ex.Store(e)
			panic(http.ErrAbortHandler)
		}))
		func() {
			defer func() {
				if v := recover(); v != http.ErrAbortHandler {
					t.Errorf("recovered %v, want http.ErrAbortHandler re-raised", v)
				}
			}()
			do(t, h, "POST", "/pay", "k", "{}")
		}()
		e := ex.Load().(idemhttp.Execution)
		if e.Key != "k" || e.Token == 0 || e.ClaimedAt.IsZero() {
			t.Fatalf("Execution %+v", e)
		}
		rec, err := store.Get(context.Background(), "", "k")
		if b.tx {
			if !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("tx: key after abort: %+v, %v; want released", rec, err)
			}
			return
		}
		if err != nil || rec.State != idem.StateInFlight || rec.Token != e.Token {
			t.Fatalf("key after abort: %+v, %v; want in flight under the aborted token", rec, err)
		}
		if m.Counts()[idemhttp.OutcomeAborted] != 1 {
			t.Fatalf("counts %v", m.Counts())
		}
	})
}

func TestProblemJSON(t *testing.T) {
	t.Parallel()
	rr := httptest.NewRecorder()
	(&idemhttp.Problem{Type: "urn:x", Title: "T", Status: 402, Detail: "d", RetryAfter: 3,
		Extra: map[string]any{"balance": 5, "status": "ignored", "account": "a"}}).Write(rr)
	want := `{"type":"urn:x","title":"T","status":402,"detail":"d","account":"a","balance":5}` + "\n"
	if rr.Body.String() != want || rr.Code != 402 || rr.Header().Get("Retry-After") != "3" ||
		rr.Header().Get("Content-Type") != idemhttp.ProblemContentType {
		t.Fatalf("got %d %v %s", rr.Code, rr.Header(), rr.Body.String())
	}
	rr = httptest.NewRecorder()
	(&idemhttp.Problem{Title: "T", Status: 500, Extra: map[string]any{"bad": func() {}}}).Write(rr)
	if rr.Body.String() != `{"type":"about:blank","title":"T","status":500}`+"\n" {
		t.Fatalf("unmarshalable extension: %s", rr.Body.String())
	}
}

// Configuration errors are *idem.ArgumentError, as every constructor's in
// the toolkit, naming the field.
func TestConfigErrorsAreArgumentErrors(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	for _, cfg := range []idemhttp.Config{
		{},
		{SharedScope: true, Store: store, TTL: -time.Second},
		{Store: store},
		{Store: store, TTL: time.Second, Lease: time.Minute},
		{Store: store, ReplayHeaders: []string{"Set-Cookie"}},
	} {
		var ae *idem.ArgumentError
		if _, err := idemhttp.New(&cfg); !errors.As(err, &ae) || !errors.Is(err, idem.ErrInvalidArgument) || !strings.HasPrefix(ae.Field, "idemhttp.Config.") {
			t.Errorf("New(%+v) = %v, want an *idem.ArgumentError naming the field", cfg, err)
		}
	}
	if _, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: store, TTL: 4 * time.Second}); err != nil {
		t.Errorf("a TTL shorter than the default lease, lease unset: %v; want the lease lowered to it", err)
	}
}
