package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// phased is a handler in two phases around a call that leaves the
// database: it saves "charging" before the call, and answers with what the
// call returned. crash makes the first execution stop after the call, as a
// process killed there would (its goroutine panics; the middleware sees a
// failure). calls counts the calls made per phase reached.
type phased struct {
	mu     sync.Mutex
	calls  int
	resume []string // the recovery point each execution started from
	crash  atomic.Bool
	// abort makes the crash cut the connection (http.ErrAbortHandler), as
	// a process killed after the charge leaves it: the key keeps its lease
	// until it ends. Otherwise the crash is a failure the middleware sees.
	abort bool
}

func (p *phased) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex, _ := idemhttp.ExecutionFromContext(r.Context())
	p.mu.Lock()
	p.resume = append(p.resume, ex.Recovery.Name)
	p.mu.Unlock()
	if ex.Recovery.IsZero() {
		if err := idemhttp.SaveRecovery(r.Context(), "charging", []byte("amount=10")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	p.charge()
	if p.crash.CompareAndSwap(true, false) {
		if p.abort {
			panic(http.ErrAbortHandler)
		}
		panic("failed after the charge")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprint(w, `{"charged":10}`)
}

func (p *phased) charge() {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
}

// crashed sends p, through h, a request whose handler aborts after the
// charge, as a process killed there would.
func crashed(t *testing.T, h http.Handler, p *phased, key string) {
	t.Helper()
	p.abort = true
	p.crash.Store(true)
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Fatalf("the crashed request ended with %v; want http.ErrAbortHandler", v)
		}
	}()
	do(t, h, "POST", "/pay", key, "{}")
}

func newPhased(t *testing.T, lease time.Duration) (*idemmem.Clock, *idemmem.Store, *idemhttp.Middleware) {
	t.Helper()
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Lease: lease, Clock: clock,
		InflightWait: 20 * time.Millisecond})
	return clock, store, m
}

func TestSaveRecoveryRefusedWhereItCannotHold(t *testing.T) {
	t.Parallel()
	if err := idemhttp.SaveRecovery(t.Context(), "charging", nil); !errors.Is(err, idemhttp.ErrNoRecovery) {
		t.Errorf("outside a protected request: %v; want ErrNoRecovery", err)
	}
	cases := map[string]idem.Store{
		// A store without points.
		"no points": storeWithoutPoints{idemmem.NewStore(nil)},
		// The handler runs in the store's transaction.
		"same transaction": txMemStore{idemmem.NewStore(nil)},
	}
	for name, store := range cases {
		t.Run(name, func(t *testing.T) {
			var got error
			h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = idemhttp.SaveRecovery(r.Context(), "charging", nil)
				w.WriteHeader(http.StatusCreated)
			}))
			do(t, h, "POST", "/pay", "k", "{}")
			if !errors.Is(got, idemhttp.ErrNoRecovery) {
				t.Fatalf("SaveRecovery = %v; want ErrNoRecovery", got)
			}
		})
	}
	// A malformed point is refused, and the execution goes on.
	_, _, m := newPhased(t, time.Minute)
	var got error
	do(t, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = idemhttp.SaveRecovery(r.Context(), "", nil)
		w.WriteHeader(http.StatusCreated)
	})), "POST", "/pay", "k", "{}")
	if !errors.Is(got, idem.ErrInvalidArgument) {
		t.Fatalf("SaveRecovery with no name = %v; want an *idem.ArgumentError", got)
	}
}

type storeWithoutPoints struct{ s *idemmem.Store }

func (s storeWithoutPoints) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	return s.s.Claim(ctx, req)
}
func (s storeWithoutPoints) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	return s.s.Complete(ctx, ref, resp)
}
func (s storeWithoutPoints) Release(ctx context.Context, ref idem.Ref) error {
	return s.s.Release(ctx, ref)
}
func (s storeWithoutPoints) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	return s.s.Renew(ctx, ref, lease)
}
func (s storeWithoutPoints) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	return s.s.Get(ctx, scope, key)
}
func (s storeWithoutPoints) Purge(ctx context.Context, limit int) (int, error) {
	return s.s.Purge(ctx, limit)
}

// txMemStore runs CompleteTx's work without a transaction: enough for the
// middleware to choose its same-transaction form.
type txMemStore struct{ *idemmem.Store }

func (s txMemStore) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	resp, keep, err := work(ctx)
	if err != nil || !keep {
		return false, err
	}
	return true, s.Complete(ctx, ref, resp)
}

// A failure after a recovery point does not release the key: it stays in
// flight with its point, its lease yielded, and the client's retry takes it
// over at once and goes on from the point: the call past the edge is made
// by the phase that needs it, not again from the start. A crash (the
// handler aborts) holds the lease until it ends.
func TestFailureAfterPointKeepsKey(t *testing.T) {
	t.Parallel()
	clock, store, m := newPhased(t, 10*time.Second)
	p := &phased{}
	p.crash.Store(true)
	h := m.Handler(p)
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("the execution that failed after its point answered %d %s; want 503", r.Status, r.Body)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || rec.LeaseExpiresAt.After(clock.Now()) {
		t.Fatalf("after the failure: %+v, %v; want the key in flight at point charging, its lease yielded", rec, err)
	}
	if n := m.Counts()[idemhttp.OutcomeUnfinished]; n != 1 {
		t.Fatalf("unfinished count %d; want 1", n)
	}
	r := do(t, h, "POST", "/pay", "k", "{}")
	if r.Status != http.StatusCreated || r.Body != `{"charged":10}` {
		t.Fatalf("the retry answered %d %s", r.Status, r.Body)
	}
	if fmt.Sprint(p.resume) != "[ charging]" {
		t.Fatalf("executions started from %q; want the first from nothing, the second from charging", p.resume)
	}
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Header.Get(idemhttp.HeaderReplayed) != "true" || r.Body != `{"charged":10}` {
		t.Fatalf("a later duplicate: %d %v %s; want the replay", r.Status, r.Header, r.Body)
	}

	// A crash after the point: the lease holds until it ends.
	crashed(t, h, p, "c")
	if r := do(t, h, "POST", "/pay", "c", "{}"); r.Status != http.StatusConflict {
		t.Fatalf("a retry within a crashed execution's lease answered %d; want 409", r.Status)
	}
	clock.Advance(11 * time.Second)
	if r := do(t, h, "POST", "/pay", "c", "{}"); r.Status != http.StatusCreated {
		t.Fatalf("the retry after the crashed execution's lease answered %d %s", r.Status, r.Body)
	}
}

// With no client retry at all, the Completer finishes the abandoned
// execution from its point, and the client who comes back later gets the
// Completer's answer replayed.
func TestCompleterFinishesAbandoned(t *testing.T) {
	t.Parallel()
	clock, store, m := newPhased(t, 10*time.Second)
	p := &phased{}
	crashed(t, m.Handler(p), p, "k")

	var resumed []idemhttp.Execution
	c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: func(ctx context.Context, w http.ResponseWriter, ex idemhttp.Execution) error {
		resumed = append(resumed, ex)
		if got, _ := idemhttp.ExecutionFromContext(ctx); got.Key != ex.Key {
			t.Errorf("Resume's context carries key %q; want %q", got.Key, ex.Key)
		}
		p.charge()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"charged":10,"by":"completer"}`)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	// Within the lease the key is not abandoned: nothing to do.
	if n, err := c.RunOnce(t.Context()); err != nil || n != 0 || len(resumed) != 0 {
		t.Fatalf("a round within the lease finished %d, %v", n, err)
	}
	clock.Advance(11 * time.Second)
	if n, err := c.RunOnce(t.Context()); err != nil || n != 1 {
		t.Fatalf("a round after the lease finished %d, %v; want 1", n, err)
	}
	if len(resumed) != 1 || resumed[0].Recovery.Name != "charging" || string(resumed[0].Recovery.Data) != "amount=10" || !resumed[0].TookOver {
		t.Fatalf("Resume saw %+v", resumed)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("after the round: %v, %v; want completed", rec.State, err)
	}
	r := do(t, m.Handler(p), "POST", "/pay", "k", "{}")
	if r.Status != http.StatusCreated || r.Body != `{"charged":10,"by":"completer"}` || r.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("the client coming back got %d %v %s; want the completer's answer replayed", r.Status, r.Header, r.Body)
	}
	if p.calls != 2 || len(p.resume) != 1 {
		t.Fatalf("calls %d, handler executions %d; want the crashed one's call and the completer's, one handler run", p.calls, len(p.resume))
	}
	if s := c.Stats(); s.Completed != 1 || s.Unknown != 0 {
		t.Fatalf("stats %+v", s)
	}
	if want := 10*time.Second + time.Second + 9*time.Second; c.Bound() != want {
		t.Fatalf("Bound() = %v; want lease + every + timeout = %v", c.Bound(), want)
	}
}

// A Resume's answer longer than MaxResponseBytes is not kept cut short:
// its writes past the bound succeed (Resume sees no error and goes on, as
// a handler does), but the round keeps nothing, and the key stays in
// flight with its point, its outcome unknown, for a later round.
func TestCompleterKeepsNoAnswerPastMaxResponseBytes(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Lease: 10 * time.Second, Clock: clock,
		InflightWait: 20 * time.Millisecond, MaxResponseBytes: 8})
	p := &phased{}
	crashed(t, m.Handler(p), p, "k")
	type wrote struct {
		n   int
		err error
	}
	var writes []wrote
	c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: func(ctx context.Context, w http.ResponseWriter, ex idemhttp.Execution) error {
		w.WriteHeader(http.StatusCreated)
		// Each slice as long as its capacity: a write past its end would
		// panic rather than pass unnoticed.
		for _, b := range [][]byte{[]byte("12345")[:5:5], []byte("678901")[:6:6], []byte("23")[:2:2]} {
			n, err := w.Write(b)
			writes = append(writes, wrote{n, err})
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(11 * time.Second)
	if n, _ := c.RunOnce(t.Context()); n != 0 {
		t.Fatalf("the round finished %d keys with an answer past the bound; want none", n)
	}
	if want := []wrote{{5, nil}, {6, nil}, {2, nil}}; !slices.Equal(writes, want) {
		t.Errorf("Resume's writes returned %v; want each whole and without error %v", writes, want)
	}
	if s := c.Stats(); s.Completed != 0 || s.Failed != 1 || s.Unknown != 1 {
		t.Errorf("stats %+v; want one failed, its outcome unknown", s)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the key: %+v, %v; want it in flight with its point", rec, err)
	}
}

// An outcome Resume cannot learn stays unknown: the key is not released,
// the Completer counts it, and tries again after the lease it took.
func TestCompleterUnknownOutcome(t *testing.T) {
	t.Parallel()
	clock, store, m := newPhased(t, 10*time.Second)
	p := &phased{}
	crashed(t, m.Handler(p), p, "k")
	networkDown := errors.New("the card network does not answer")
	var down atomic.Bool
	down.Store(true)
	c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: func(ctx context.Context, w http.ResponseWriter, ex idemhttp.Execution) error {
		if down.Load() {
			return networkDown
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(11 * time.Second)
	failedAt := clock.Now()
	if n, _ := c.RunOnce(t.Context()); n != 0 {
		t.Fatalf("finished %d with the network down", n)
	}
	s := c.Stats()
	clock.Advance(time.Second)
	if s = c.Stats(); s.Unknown != 1 || s.Failed != 1 || !s.OldestUnknown.Equal(failedAt) || s.UnknownFor != time.Second {
		t.Fatalf("stats %+v; want one unknown since %v", s, failedAt)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the unknown key: %+v, %v; want it in flight with its point", rec, err)
	}
	// The lease the Completer took has not ended: the next round leaves it.
	if n, _ := c.RunOnce(t.Context()); n != 0 || c.Stats().Failed != 1 {
		t.Fatalf("a round within the completer's lease tried again")
	}
	down.Store(false)
	clock.Advance(11 * time.Second)
	if n, _ := c.RunOnce(t.Context()); n != 1 {
		t.Fatal("the round after the network came back did not finish the key")
	}
	if s := c.Stats(); s.Unknown != 0 || s.Completed != 1 {
		t.Fatalf("stats %+v; want it finished and no longer unknown", s)
	}
}

// ErrNothingDone releases the key, and the next request with it runs anew.
func TestCompleterReleasesWhenNothingDone(t *testing.T) {
	t.Parallel()
	clock, store, m := newPhased(t, 10*time.Second)
	p := &phased{}
	crashed(t, m.Handler(p), p, "k")
	c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		return fmt.Errorf("no charge under this key: %w", idemhttp.ErrNothingDone)
	}})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(11 * time.Second)
	if n, _ := c.RunOnce(t.Context()); n != 1 {
		t.Fatal("the round did not end the key")
	}
	if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after the release = %v; want ErrNotFound", err)
	}
	if s := c.Stats(); s.Released != 1 {
		t.Fatalf("stats %+v", s)
	}
	if r := do(t, m.Handler(p), "POST", "/pay", "k", "{}"); r.Status != http.StatusCreated || r.Header.Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("the next request: %d %v; want a new execution", r.Status, r.Header)
	}
}

// Two Completers (two replicas) on one abandoned key: one resumes it.
func TestCompletersShareTheWork(t *testing.T) {
	t.Parallel()
	clock, _, m := newPhased(t, 10*time.Second)
	p := &phased{}
	for i := range 20 {
		crashed(t, m.Handler(p), p, fmt.Sprint("k", i))
	}
	var resumes atomic.Int64
	resume := func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		resumes.Add(1)
		return nil
	}
	clock.Advance(11 * time.Second)
	var wg sync.WaitGroup
	for range 2 {
		c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: resume})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { c.RunOnce(t.Context()) })
	}
	wg.Wait()
	if resumes.Load() != 20 {
		t.Fatalf("%d resumes of 20 abandoned keys; want each once", resumes.Load())
	}
}

func TestNewCompleterRefuses(t *testing.T) {
	t.Parallel()
	_, _, m := newPhased(t, time.Minute)
	resume := func(context.Context, http.ResponseWriter, idemhttp.Execution) error { return nil }
	for name, cfg := range map[string]*idemhttp.CompleterConfig{
		"nil":            nil,
		"no resume":      {},
		"negative every": {Resume: resume, Every: -1},
		"negative limit": {Resume: resume, Limit: -1},
	} {
		if _, err := m.NewCompleter(cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: %v; want an *idem.ArgumentError", name, err)
		}
	}
	plain := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: storeWithoutPoints{idemmem.NewStore(nil)}})
	if _, err := plain.NewCompleter(&idemhttp.CompleterConfig{Resume: resume}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("a store without points: %v; want an *idem.ArgumentError", err)
	}
}

// An unknown outcome that a client's retry finishes is no longer counted
// as unknown, though the Completer never resumed it again.
func TestCompleterForgetsOutcomesOthersFinish(t *testing.T) {
	t.Parallel()
	clock, _, m := newPhased(t, 10*time.Second)
	p := &phased{}
	h := m.Handler(p)
	crashed(t, h, p, "k")
	c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		return errors.New("the card network does not answer")
	}})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(11 * time.Second)
	c.RunOnce(t.Context())
	if s := c.Stats(); s.Unknown != 1 {
		t.Fatalf("stats %+v; want one unknown", s)
	}
	// The completer's own lease ends; the client's retry takes the key
	// over and finishes it.
	clock.Advance(11 * time.Second)
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Status != http.StatusCreated {
		t.Fatalf("the client's retry answered %d %s", r.Status, r.Body)
	}
	c.RunOnce(t.Context())
	if s := c.Stats(); s.Unknown != 0 {
		t.Fatalf("stats %+v; want the finished key no longer unknown", s)
	}
}

// A key released between the listing and the Completer's claim is claimed
// anew, with no point: the Completer gives it back and resumes nothing.
func TestCompleterGivesBackKeysClaimedAnew(t *testing.T) {
	t.Parallel()
	clock, store, m := newPhased(t, 10*time.Second)
	p := &phased{}
	crashed(t, m.Handler(p), p, "k")
	clock.Advance(11 * time.Second)
	var resumed atomic.Int64
	lister := releasedAfterListing{Store: store}
	m2 := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: lister, Lease: 10 * time.Second, Clock: clock})
	c, err := m2.NewCompleter(&idemhttp.CompleterConfig{Resume: func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		resumed.Add(1)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.RunOnce(t.Context()); err != nil || n != 0 || resumed.Load() != 0 {
		t.Fatalf("round: finished %d, %v, %d resumes; want none", n, err, resumed.Load())
	}
	if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get = %v; want the key given back (not found)", err)
	}
}

// releasedAfterListing releases every key Abandoned lists, as an operator
// (or a retry that found nothing done) might between the listing and the
// Completer's claim.
type releasedAfterListing struct{ *idemmem.Store }

func (s releasedAfterListing) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	recs, err := s.Store.Abandoned(ctx, limit)
	for _, r := range recs {
		if rerr := s.ReleaseWithPoint(ctx, idem.Ref{Scope: r.Scope, Key: r.Key, Token: r.Token}); rerr != nil {
			return nil, rerr
		}
	}
	return recs, err
}
