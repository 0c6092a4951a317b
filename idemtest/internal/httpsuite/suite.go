// Package httpsuite holds the cases of idemtest.TestMiddleware: idemhttp's
// middleware in front of a store, as a request and its duplicates meet it.
package httpsuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/eventually"
	"github.com/idem-go/idem/internal/httpcheck"
)

// The helpers of the middleware's tests, shared with idemtest's
// (internal/httpcheck).
type (
	result       = httpcheck.Result
	lockedWriter = httpcheck.LockedWriter
	recording    = httpcheck.Recording
	phaseKey     = httpcheck.PhaseKey
)

var (
	do            = httpcheck.Do
	problemType   = httpcheck.ProblemType
	newMiddleware = httpcheck.NewMiddleware
	counter       = httpcheck.Counter
)

// backend is the store under test: open makes a fresh, empty one, and tx
// says whether it offers the same-transaction form (idem.TxStore), whose
// answers to a few failures differ.
type backend struct {
	open func(t *testing.T, clock idem.Clock) idem.Store
	tx   bool
}

// Run runs every case as a parallel subtest on stores open makes.
func Run(t *testing.T, open func(t *testing.T, clock idem.Clock) idem.Store) {
	t.Helper()
	probe := open(t, idem.SystemClock{})
	_, tx := probe.(idem.TxStore)
	b := backend{open: open, tx: tx}
	for _, c := range []struct {
		name string
		run  func(t *testing.T, b backend)
	}{
		{"RequestValidation", mwRequestValidation},
		{"Replay", mwReplay},
		{"RecentKeysAnsweredWithOneRead", mwRecentKeysAnsweredWithOneRead},
		{"MemoryReplay", mwMemoryReplay},
		{"ConcurrentDuplicatesExecuteOnce", mwConcurrentDuplicatesExecuteOnce},
		{"InFlightConflictAndMismatch", mwInFlightConflictAndMismatch},
		{"FailuresAreClassified", mwFailuresAreClassified},
		{"StoreDownFailsClosed", mwStoreDownFailsClosed},
		{"ScopesIsolateKeys", mwScopesIsolateKeys},
		{"TTLExpiry", mwTTLExpiry},
		{"LeaseTakeoverFencing", mwLeaseTakeoverFencing},
		{"LargeResponses", mwLargeResponses},
		{"FlushAndUnwrap", mwFlushAndUnwrap},
		{"AbortLeavesKeyToLease", mwAbortLeavesKeyToLease},
		{"KeySecretSealsKeys", mwKeySecretSealsKeys},
		{"BodyKeysSealBodies", mwBodyKeysSealBodies},
		{"SealedBodyBoundToItsRecord", mwSealedBodyBoundToItsRecord},
		{"DiscardBodies", mwDiscardBodies},
		{"AtRestConfigRefused", mwAtRestConfigRefused},
		{"ObserverSeesPhases", mwObserverSeesPhases},
		{"PointNeverReleased", mwPointNeverReleased},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, b)
		})
	}
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

// replaySpy is a spyStore that keeps a Replayer face.
type replaySpy struct{ *spyStore }

func (s replaySpy) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	return s.spyStore.replay(ctx, scope, key, fp)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	eventually.True(t, 20*time.Second, "the condition", cond)
}

func mwRequestValidation(t *testing.T, b backend) {
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
		if r.Status != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, r.Status, tc.status, r.Body)
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
	if r := do(t, h, "POST", "/pay", "k-large", `{}`); r.Status != 201 {
		t.Fatalf("after 413, status %d", r.Status)
	}
	// The middleware's own rejections are counted, nothing else.
	c := m.Counts()
	if c[idemhttp.OutcomeRejected] != uint64(len(tests)) || c[idemhttp.OutcomeExecuted] != 1 {
		t.Fatalf("counts %v", c)
	}
}

func mwReplay(t *testing.T, b backend) {
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, idem.SystemClock{})}).Handler(counter(&n))
	first := do(t, h, "POST", "/pay?b=2&a=1", "key-1", `{"amount": 100, "currency": "KRW"}`)
	if first.Status != 201 || first.Header.Get(idemhttp.HeaderReplayed) != "" || first.Header.Get("Set-Cookie") == "" {
		t.Fatalf("first: %+v", first)
	}
	// The same request re-serialised, with its query reordered, and the
	// key in its structured-field form.
	again := do(t, h, "POST", "/pay?a=1&b=2", `"key-1"`, `{"currency":"KRW","amount":100}`)
	if again.Status != 201 || again.Body != first.Body {
		t.Fatalf("replay: %+v, first %+v", again, first)
	}
	if again.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay lacks %s: %v", idemhttp.HeaderReplayed, again.Header)
	}
	if again.Header.Get("Location") != first.Header.Get("Location") || again.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replayed headers %v", again.Header)
	}
	if again.Header.Get("Set-Cookie") != "" || again.Header.Get("X-Private") != "" {
		t.Fatalf("replay leaked headers outside the allow-list: %v", again.Header)
	}
	if n.Load() != 1 {
		t.Fatalf("executions %d, want 1", n.Load())
	}
}

// A duplicate of a key this process saw completed, its answer no longer
// in memory (here MemoryReplayFor is off), is answered from one read of
// the record, without a claim; one it did not see (another process's, or
// with RecentKeys off) is claimed and answered from the claim. Either way
// it is the same answer.
func mwRecentKeysAnsweredWithOneRead(t *testing.T, b backend) {
	store, sp := spy(b.open(t, idem.SystemClock{}))
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, MemoryReplayFor: -1}).Handler(counter(&n))
	first := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
	if first.Status != 201 || sp.claims.Load() != 1 || sp.reads() != 0 {
		t.Fatalf("first: %+v, %d claims, %d reads; want 201 after one claim", first, sp.claims.Load(), sp.reads())
	}
	again := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
	if again.Status != 201 || again.Body != first.Body || again.Header.Get(idemhttp.HeaderReplayed) != "true" ||
		again.Header.Get("Location") != first.Header.Get("Location") || again.Header.Get("Set-Cookie") != "" {
		t.Fatalf("replay from the record: %+v, first %+v", again, first)
	}
	if sp.claims.Load() != 1 || sp.reads() != 1 {
		t.Errorf("replay: %d claims, %d reads in all; want the first's claim and one read", sp.claims.Load(), sp.reads())
	}
	// A store that reads replays narrowly is read through Replay.
	if _, ok := store.(idem.Replayer); ok && sp.replays.Load() != 1 {
		t.Errorf("replay: %d Replays, %d Gets of a Replayer; want the read to be a Replay", sp.replays.Load(), sp.gets.Load())
	}
	if r := do(t, h, "POST", "/pay", "k-1", `{"amount":999}`); r.Status != 422 || problemType(t, r) != idemhttp.ProblemKeyMismatch {
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
		if r.Status != 201 || r.Body != first.Body || r.Header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Errorf("RecentKeys %d, replay from the claim: %+v", cfg.RecentKeys, r)
		}
		if sp.claims.Load() != before+1 {
			t.Errorf("RecentKeys %d: %d claims for a key it never saw, want 1", cfg.RecentKeys, sp.claims.Load()-before)
		}
	}
	if n.Load() != 1 {
		t.Errorf("%d executions, want 1", n.Load())
	}
}

// MemoryReplay: a duplicate reaching the process that completed its
// key within MemoryReplayFor is answered from memory, with no read of the
// store, and with the answer the store would give; another request under
// the key is still refused from the store's record. Past MemoryReplayFor
// the store answers, and past the TTL the request runs again.
func mwMemoryReplay(t *testing.T, b backend) {
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, sp := spy(b.open(t, clock))
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Clock: clock, TTL: time.Hour}).Handler(counter(&n))
	first := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
	other := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Clock: clock, MemoryReplayFor: -1, RecentKeys: -1}).Handler(counter(&n))
	fromStore := do(t, other, "POST", "/pay", "k-1", `{"amount":100}`)
	claims, reads := sp.claims.Load(), sp.reads()

	clock.Advance(9 * time.Second)
	again := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`)
	if again.Status != first.Status || again.Body != first.Body || !reflect.DeepEqual(again.Header, fromStore.Header) {
		t.Errorf("replay from memory: %+v\nfrom the store: %+v", again, fromStore)
	}
	if sp.claims.Load() != claims || sp.reads() != reads {
		t.Errorf("replay from memory: %d claims, %d reads of the store; want none", sp.claims.Load()-claims, sp.reads()-reads)
	}
	if r := do(t, h, "POST", "/pay", "k-1", `{"amount":999}`); r.Status != 422 || problemType(t, r) != idemhttp.ProblemKeyMismatch {
		t.Errorf("another body under a key in memory: %+v, want 422", r)
	}

	clock.Advance(time.Second) // MemoryReplayFor (10s) has passed
	reads = sp.reads()
	if r := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`); r.Body != first.Body || r.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("replay past MemoryReplayFor: %+v", r)
	}
	if sp.reads() != reads+1 {
		t.Errorf("replay past MemoryReplayFor: %d reads of the store, want 1", sp.reads()-reads)
	}
	clock.Advance(time.Hour)
	if r := do(t, h, "POST", "/pay", "k-1", `{"amount":100}`); r.Body != `{"execution":2}` {
		t.Errorf("past the TTL: %+v, want a second execution", r)
	}
	if n.Load() != 2 {
		t.Errorf("%d executions, want 2", n.Load())
	}
}

func mwConcurrentDuplicatesExecuteOnce(t *testing.T, b backend) {
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
		if r.Status != 201 || r.Body != `{"execution":1}` {
			t.Fatalf("answer %+v", r)
		}
		if r.Header.Get(idemhttp.HeaderReplayed) == "true" {
			replayed++
		}
	}
	if n.Load() != 1 || replayed != N-1 {
		t.Fatalf("executions %d, replayed %d; want 1 and %d", n.Load(), replayed, N-1)
	}
}

func mwInFlightConflictAndMismatch(t *testing.T, b backend) {
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
	if r.Status != 409 || r.Header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemInFlight {
		t.Fatalf("duplicate in flight: %+v", r)
	}
	r = do(t, h, "POST", "/pay", "k", `{"amount":2}`)
	if r.Status != 422 || problemType(t, r) != idemhttp.ProblemKeyMismatch {
		t.Fatalf("mismatch in flight: %+v", r)
	}
	r = do(t, h, "PATCH", "/pay", "k", `{"amount":1}`)
	if r.Status != 422 {
		t.Fatalf("same key, other method: %+v", r)
	}
	close(release)
	if first := <-done; first.Status != 201 {
		t.Fatalf("first: %+v", first)
	}
	r = do(t, h, "POST", "/pay", "k", `{"amount":2}`)
	if r.Status != 422 {
		t.Fatalf("mismatch after completion: %+v", r)
	}
	if n.Load() != 1 {
		t.Fatalf("executions %d", n.Load())
	}
}

func mwFailuresAreClassified(t *testing.T, b backend) {
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
		if first.Status < 400 {
			t.Fatalf("%s first: %+v", path, first)
		}
		if path == "/panic" && (first.Status != 500 || problemType(t, first) != idemhttp.ProblemHandlerFailed) {
			t.Fatalf("panic answered %+v", first)
		}
		retry := do(t, h, "POST", path, "key"+path, "{}")
		if retry.Status != 201 || retry.Body != "ok 2" || retry.Header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("%s retry did not run again: %+v", path, retry)
		}
	}
	n.Store(0)
	first := do(t, h, "POST", "/402", "k402", "{}")
	again := do(t, h, "POST", "/402", "k402", "{}")
	if first.Status != 402 || again.Status != 402 || again.Body != "insufficient funds 1" || again.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("402 not replayed: %+v then %+v", first, again)
	}
}

func mwStoreDownFailsClosed(t *testing.T, b backend) {
	store, sp := spy(b.open(t, idem.SystemClock{}))
	sp.fail.Store(true)
	var n atomic.Int64
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store})
	r := do(t, m.Handler(counter(&n)), "POST", "/pay", "k", "{}")
	if r.Status != 503 || r.Header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemStoreUnavailable {
		t.Fatalf("store down: %+v", r)
	}
	if n.Load() != 0 {
		t.Fatal("handler ran without protection while the store was down")
	}
	if m.Counts()[idemhttp.OutcomeStoreError] != 1 {
		t.Fatalf("counts %v", m.Counts())
	}
	sp.fail.Store(false)
	if r := do(t, m.Handler(counter(&n)), "POST", "/pay", "k", "{}"); r.Status != 201 || n.Load() != 1 {
		t.Fatalf("after recovery: %+v", r)
	}
}

func mwScopesIsolateKeys(t *testing.T, b backend) {
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
	if a.Body == b2.Body || b2.Header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("tenant b got tenant a's answer: %+v %+v", a, b2)
	}
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Status != 400 || problemType(t, r) != idemhttp.ProblemScope {
		t.Fatalf("no scope: %+v", r)
	}
}

func mwTTLExpiry(t *testing.T, b backend) {
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: b.open(t, clock), TTL: time.Hour}).Handler(counter(&n))
	do(t, h, "POST", "/pay", "k", "{}")
	clock.Advance(59 * time.Minute)
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay before expiry: %+v", r)
	}
	clock.Advance(2 * time.Minute)
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Body != `{"execution":2}` {
		t.Fatalf("after expiry: %+v", r)
	}
}

// LeaseTakeoverFencing: an execution that outlives its lease is taken
// over by a retry; its late completion is refused, and with the
// same-transaction form its effect is rolled back.
func mwLeaseTakeoverFencing(t *testing.T, b backend) {
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := b.open(t, clock)
	if claimsInTx(store) {
		t.Skip("a TxClaimer claims in the handler's own transaction, which nobody can take over: no lease to outlive")
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{W: &logs, Mu: &logMu}, nil))
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
	if second.Status != 201 || second.Body != "execution 2" {
		t.Fatalf("takeover: %+v", second)
	}
	close(release)
	r1 := <-first
	if b.tx {
		if r1.Status != 503 || problemType(t, r1) != idemhttp.ProblemLeaseLost {
			t.Fatalf("late execution with the same-transaction form: %+v", r1)
		}
	} else if r1.Status != 201 {
		t.Fatalf("late execution: %+v", r1)
	}
	if r := do(t, h, "POST", "/pay", "secret-key-123", "{}"); r.Body != "execution 2" {
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
}

func mwLargeResponses(t *testing.T, b backend) {
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
		if first.Status != 500 || problemType(t, first) != idemhttp.ProblemResponseTooLarge {
			t.Fatalf("tx: %+v", first)
		}
		if r := do(t, h, "POST", "/pay", "k", "{}"); r.Status != 500 || n.Load() != 2 {
			t.Fatalf("tx retry should run again: %+v, executions %d", r, n.Load())
		}
		return
	}
	if first.Status != 201 || first.Body != big {
		t.Fatalf("first caller must get the whole answer: %+v", first)
	}
	r := do(t, h, "POST", "/pay", "k", "{}")
	if r.Status != 201 || r.Body != "" || r.Header.Get(idemhttp.HeaderBodyOmitted) != "true" || r.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay of an omitted body: %+v", r)
	}
	if n.Load() != 1 {
		t.Fatalf("executions %d", n.Load())
	}
}

func mwFlushAndUnwrap(t *testing.T, b backend) {
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
}

// AbortLeavesKeyToLease: a handler that cuts the connection is treated
// like a crash. Outside a shared transaction its effect may have happened,
// so the key stays in flight until its lease ends; inside one, the effect
// was rolled back and the key is released.
func mwAbortLeavesKeyToLease(t *testing.T, b backend) {
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
}

var (
	keySecret = []byte("0123456789abcdef0123456789abcdef")
	bodyKeyA  = idemhttp.BodyKey{ID: "a", Key: bytes.Repeat([]byte{1}, 32)}
	bodyKeyB  = idemhttp.BodyKey{ID: "b", Key: bytes.Repeat([]byte{2}, 32)}
)

func tenantScope(r *http.Request) (idem.Scope, error) {
	return idem.Scope(r.Header.Get("X-Tenant")), nil
}

// Keys sealed with a secret never reach the store as they were sent, and
// everything a key does still works: replays, from this process and from
// another, mismatches, and scopes kept apart.
func mwKeySecretSealsKeys(t *testing.T, b backend) {
	store := b.open(t, idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var n atomic.Int64
	var seen atomic.Value
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ex, _ := idemhttp.ExecutionFromContext(r.Context())
		seen.Store(ex.Key)
		counter(&n).ServeHTTP(w, r)
	})
	cfg := idemhttp.Config{Store: store, Scope: tenantScope, KeySecret: keySecret}
	first := newMiddleware(t, cfg).Handler(h)
	other := newMiddleware(t, cfg).Handler(h) // another process: nothing recent

	r1 := do(t, first, "POST", "/pay", "order-1", `{"a":1}`, "X-Tenant", "t1")
	if r1.Status != http.StatusCreated {
		t.Fatalf("first: %d %s", r1.Status, r1.Body)
	}
	sealed := idemhttp.SealKey(keySecret, "t1", "order-1")
	if got := seen.Load().(idem.Key); got != sealed {
		t.Fatalf("Execution.Key = %q, want the sealed key %q", got, sealed)
	}
	if !idemhttp.IsSealedKey(sealed) || idemhttp.IsSealedKey("order-1") {
		t.Fatalf("IsSealedKey(%q) or IsSealedKey(order-1) wrong", sealed)
	}
	if _, err := idem.ParseKey(string(sealed)); err != nil {
		t.Fatalf("a sealed key must be a valid key to pass downstream: %v", err)
	}
	if _, err := store.Get(context.Background(), "t1", "order-1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the key as sent is in the store: Get = %v", err)
	}
	if rec, err := store.Get(context.Background(), "t1", sealed); err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("the sealed key: %+v, %v", rec, err)
	}
	for name, h := range map[string]http.Handler{"same process": first, "other process": other} {
		r := do(t, h, "POST", "/pay", "order-1", `{"a":1}`, "X-Tenant", "t1")
		if r.Status != http.StatusCreated || r.Body != r1.Body || r.Header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("%s: duplicate got %d %q (replayed %q), want the first answer %q", name, r.Status, r.Body, r.Header.Get(idemhttp.HeaderReplayed), r1.Body)
		}
		if r := do(t, h, "POST", "/pay", "order-1", `{"a":2}`, "X-Tenant", "t1"); r.Status != http.StatusUnprocessableEntity {
			t.Fatalf("%s: another body under the key got %d, want 422", name, r.Status)
		}
	}
	// The same key from another tenant is another key.
	if r := do(t, other, "POST", "/pay", "order-1", `{"a":2}`, "X-Tenant", "t2"); r.Status != http.StatusCreated || r.Header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("another tenant's key: %d %q", r.Status, r.Body)
	}
	if seen.Load().(idem.Key) == sealed {
		t.Fatal("two tenants' keys sealed alike")
	}
	// A client that sends a sealed key gets it sealed again: it never
	// addresses the record it names.
	if r := do(t, other, "POST", "/pay", string(sealed), `{"a":9}`, "X-Tenant", "t1"); r.Status != http.StatusCreated || r.Header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("a sealed key sent as a key: %d %q, want a new execution", r.Status, r.Body)
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("%d executions, want 3", got)
	}
}

// Bodies sealed with BodyKeys are not in the store in clear, replay as they
// were written, open after a key rotation, and refuse (500, nothing run
// again) when no configured key opens them.
func mwBodyKeysSealBodies(t *testing.T, b backend) {
	store := b.open(t, idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var n atomic.Int64
	h := counter(&n)
	withA := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyA}}).Handler(h)
	r1 := do(t, withA, "POST", "/pay", "k1", `{}`)
	if r1.Status != http.StatusCreated || r1.Body != `{"execution":1}` {
		t.Fatalf("first: %d %q", r1.Status, r1.Body)
	}
	rec, err := store.Get(context.Background(), "", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(rec.Response.Body, []byte("execution")) {
		t.Fatalf("the store keeps the body in clear: %q", rec.Response.Body)
	}

	// Rotated: B seals from now on, A still opens.
	rotated := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyB, bodyKeyA}}).Handler(h)
	if r := do(t, rotated, "POST", "/pay", "k1", `{}`); r.Status != http.StatusCreated || r.Body != r1.Body {
		t.Fatalf("replay after rotation: %d %q, want %q", r.Status, r.Body, r1.Body)
	}
	r2 := do(t, rotated, "POST", "/pay", "k2", `{}`)
	// A body kept before encryption was turned on replays as it is.
	plain := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true}).Handler(h)
	r3 := do(t, plain, "POST", "/pay", "k3", `{}`)
	onlyB := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyB}}).Handler(h)
	if r := do(t, onlyB, "POST", "/pay", "k2", `{}`); r.Status != http.StatusCreated || r.Body != r2.Body {
		t.Fatalf("replay with B: %d %q, want %q", r.Status, r.Body, r2.Body)
	}
	if r := do(t, onlyB, "POST", "/pay", "k3", `{}`); r.Status != http.StatusCreated || r.Body != r3.Body {
		t.Fatalf("replay of a body kept in clear: %d %q, want %q", r.Status, r.Body, r3.Body)
	}
	// A is gone: k1's body cannot be opened, and k1 does not run again.
	before := n.Load()
	r := do(t, onlyB, "POST", "/pay", "k1", `{}`)
	if r.Status != http.StatusInternalServerError || problemType(t, r) != idemhttp.ProblemAnswerUnreadable {
		t.Fatalf("replay without its key: %d %q, want 500 %s", r.Status, r.Body, idemhttp.ProblemAnswerUnreadable)
	}
	// Without any BodyKeys, a sealed body is refused the same way, never
	// sent as the ciphertext.
	if r := do(t, plain, "POST", "/pay", "k2", `{}`); r.Status != http.StatusInternalServerError || strings.Contains(r.Body, "idem-gcm") {
		t.Fatalf("sealed body without BodyKeys: %d %q", r.Status, r.Body)
	}
	if n.Load() != before {
		t.Fatal("an unreadable answer ran the request again")
	}
}

// A sealed body is bound to its record: copied to another key, it does not
// open there.
func mwSealedBodyBoundToItsRecord(t *testing.T, b backend) {
	store := b.open(t, idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var n atomic.Int64
	m := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyA}, RecentKeys: -1})
	h := m.Handler(counter(&n))
	do(t, h, "POST", "/pay", "k1", `{}`)
	ctx := context.Background()
	rec1, err := store.Get(ctx, "", "k1")
	if err != nil {
		t.Fatal(err)
	}
	// k2 is kept with k1's sealed body, as a person with write access to
	// the store might try.
	claim, err := store.Claim(ctx, idem.ClaimRequest{Key: "k2", Fingerprint: rec1.Fingerprint, Lease: rec1.LeaseExpiresAt.Sub(rec1.CreatedAt), TTL: rec1.ExpiresAt.Sub(rec1.CreatedAt)})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim k2: %+v %v", claim, err)
	}
	if err := store.Complete(ctx, idem.Ref{Key: "k2", Token: claim.Token}, *rec1.Response); err != nil {
		t.Fatal(err)
	}
	if r := do(t, h, "POST", "/pay", "k2", `{}`); r.Status != http.StatusInternalServerError {
		t.Fatalf("a body moved to another record: %d %q, want 500", r.Status, r.Body)
	}
	if r := do(t, h, "POST", "/pay", "k1", `{}`); r.Status != http.StatusCreated || r.Body != `{"execution":1}` {
		t.Fatalf("its own record: %d %q", r.Status, r.Body)
	}
}

// DiscardBodies keeps status and headers only.
func mwDiscardBodies(t *testing.T, b backend) {
	store := b.open(t, idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, DiscardBodies: true}).Handler(counter(&n))
	if r := do(t, h, "POST", "/pay", "k1", `{}`); r.Body != `{"execution":1}` {
		t.Fatalf("the first answer keeps its body: %q", r.Body)
	}
	if rec, err := store.Get(context.Background(), "", "k1"); err != nil || len(rec.Response.Body) != 0 || !rec.Response.BodyOmitted {
		t.Fatalf("kept: %+v %v, want no body", rec.Response, err)
	}
	r := do(t, h, "POST", "/pay", "k1", `{}`)
	if r.Status != http.StatusCreated || r.Body != "" || r.Header.Get(idemhttp.HeaderBodyOmitted) != "true" || r.Header.Get("Location") != "/things/1" {
		t.Fatalf("replay: %d %q %v", r.Status, r.Body, r.Header)
	}
}

func mwAtRestConfigRefused(t *testing.T, b backend) {
	store := b.open(t, idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	for name, cfg := range map[string]idemhttp.Config{
		"short secret":  {KeySecret: []byte("short")},
		"short AES key": {BodyKeys: []idemhttp.BodyKey{{ID: "a", Key: make([]byte, 16)}}},
		"no ID":         {BodyKeys: []idemhttp.BodyKey{{Key: make([]byte, 32)}}},
		"ID with space": {BodyKeys: []idemhttp.BodyKey{{ID: "a b", Key: make([]byte, 32)}}},
		"ID twice":      {BodyKeys: []idemhttp.BodyKey{bodyKeyA, {ID: "a", Key: make([]byte, 32)}}},
	} {
		cfg.Store, cfg.SharedScope = store, true
		if _, err := idemhttp.New(&cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: New = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// Every protected request is one PhaseRequest with its outcome around the
// phases it went through, each begun and ended once, in each of the
// middleware's forms; the handler runs in the handler phase's context.
func mwObserverSeesPhases(t *testing.T, b backend) {
	rec := &recording{}
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: b.open(t, nil), Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Context().Value(phaseKey{}).(int); !ok {
			t.Error("the handler's context does not carry the handler phase's")
		}
		if strings.Contains(r.URL.Path, "fail") {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(path, key, body string) {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	cases := []struct {
		name, path, key, body string
		outcome               idemhttp.Outcome
		phases                []string
		claim                 string
		status                int
		stores                []idemhttp.StoreOp
	}{
		{"first", "/pay", "k1", `{"a":1}`, idemhttp.OutcomeExecuted,
			[]string{"request", "claim", "handler", "complete"}, idemhttp.ClaimAcquired, 201,
			[]idemhttp.StoreOp{idemhttp.StoreClaim, idemhttp.StoreComplete}},
		{"replay", "/pay", "k1", `{"a":1}`, idemhttp.OutcomeReplayed,
			[]string{"request", "replay"}, "", 201, nil},
		{"mismatch", "/pay", "k1", `{"a":2}`, idemhttp.OutcomeMismatch,
			[]string{"request", "replay"}, "", 422, nil},
		{"released", "/fail", "k2", `{}`, idemhttp.OutcomeReleased,
			[]string{"request", "claim", "handler", "complete"}, idemhttp.ClaimAcquired, 503,
			[]idemhttp.StoreOp{idemhttp.StoreClaim}},
		{"rejected", "/pay", "", `{}`, idemhttp.OutcomeRejected, []string{"request"}, "", 0, nil},
	}
	for _, c := range cases {
		send(c.path, c.key, c.body)
		log, ends, stores := rec.Take()
		var begun []string
		for _, l := range log {
			if strings.HasPrefix(l, "!") {
				t.Errorf("%s: %s", c.name, l)
			}
			if p, ok := strings.CutPrefix(l, "+"); ok {
				begun = append(begun, p)
			}
		}
		if !slices.Equal(begun, c.phases) {
			t.Errorf("%s: phases %v, want %v (log %v)", c.name, begun, c.phases, log)
		}
		if len(ends) != len(begun) || log[len(log)-1] != "-request" {
			t.Errorf("%s: log %v: want every phase ended once, the request last", c.name, log)
		}
		req, _ := httpcheck.Ended(ends, idemhttp.PhaseRequest)
		if req.Outcome != c.outcome || req.Status != c.status || req.Store == "" || req.Duration <= 0 {
			t.Errorf("%s: request ended with outcome %q, status %d, store %q, duration %v; want %q, %d",
				c.name, req.Outcome, req.Status, req.Store, req.Duration, c.outcome, c.status)
		}
		if c.key != "" && string(req.Key) != c.key {
			t.Errorf("%s: the request's key is %q, want %q", c.name, req.Key, c.key)
		}
		if cl, ok := httpcheck.Ended(ends, idemhttp.PhaseClaim); ok && cl.Claim != c.claim {
			t.Errorf("%s: claim %q, want %q", c.name, cl.Claim, c.claim)
		}
		for _, op := range c.stores {
			if !slices.Contains(stores, op) {
				t.Errorf("%s: store round trips %v, want %s among them", c.name, stores, op)
			}
		}
	}
}

// claimsInTx reports whether the middleware claims store's keys in the
// handler's transaction (ClaimTx): a TxClaimer, unless it writes serially
// (idem.SerialWriter), where the middleware claims with Claim first.
func claimsInTx(store idem.Store) bool {
	if _, ok := store.(idem.TxClaimer); !ok {
		return false
	}
	sw, ok := store.(idem.SerialWriter)
	return !ok || !sw.WritesSerially()
}

// PointNeverReleased: a key that carries a recovery point (an earlier
// execution saved it, then died) is never released after a failure, in
// whatever form the middleware runs its handler: the same-transaction
// forms included, where the handler's rollback cannot undo what the
// earlier execution did past the database's edge. The key stays in flight
// with its point for the next retry or a Completer.
func mwPointNeverReleased(t *testing.T, b backend) {
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := b.open(t, clock)
	rs, ok := store.(idem.Recoverer)
	if !ok {
		t.Skipf("%T keeps no recovery points", store)
	}
	ctx := context.Background()
	const lease = time.Minute
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Clock: clock, Lease: lease, InflightWait: -1})
	var runs atomic.Int64
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ex, _ := idemhttp.ExecutionFromContext(r.Context())
		if ex.Recovery.Name != "charging" {
			t.Errorf("the execution goes on from %q, want charging", ex.Recovery.Name)
		}
		w.WriteHeader(http.StatusServiceUnavailable) // the card network is down: transient
	}))
	// An execution claimed the key, saved its point before the charge,
	// and died.
	body := `{"amount":10}`
	fp := idem.NewFingerprint(http.MethodPost, "/pay", "", "application/json", []byte(body))
	claim, err := store.Claim(ctx, idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: lease, TTL: 24 * time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v %v", claim, err)
	}
	if err := rs.SaveRecovery(ctx, idem.Ref{Key: "k", Token: claim.Token}, idem.RecoveryPoint{Name: "charging", Data: []byte("10")}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(lease + time.Second)
	rr := do(t, h, http.MethodPost, "/pay", "k", body, "Content-Type", "application/json")
	if runs.Load() != 1 {
		t.Fatalf("the retry ran the handler %d times, want 1 (answered %d %s)", runs.Load(), rr.Status, rr.Body)
	}
	rec, err := store.Get(ctx, "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("after the failure: %+v, %v; want the key in flight with its point, never released", rec, err)
	}
	if c := m.Counts(); c[idemhttp.OutcomeUnfinished] != 1 || c[idemhttp.OutcomeReleased] != 0 {
		t.Fatalf("counts %v: want the failure unfinished, nothing released", c)
	}
	// The next retry takes it over at once (the lease was yielded, or had
	// ended) and goes on from the point.
	do(t, h, http.MethodPost, "/pay", "k", body, "Content-Type", "application/json")
	if runs.Load() != 2 {
		t.Fatalf("the next retry: %d runs in all, want 2", runs.Load())
	}
}
