package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// waitLimit bounds every wait for another goroutine in the suite. It is
// generous because it is only reached when a store is broken.
const waitLimit = 10 * time.Second

var txStoreTests = []struct {
	name string
	run  func(t *testing.T, e *env, s idem.TxStore)
}{
	{"Keep", testTxKeep},
	{"NotKept", testTxNotKept},
	{"WorkError", testTxWorkError},
	{"LeaseTakenOver", testTxLeaseTakenOver},
	{"Released", testTxReleased},
	{"CompleteTxTwice", testTxTwice},
}

// work returns a TxWork that counts its calls and answers resp, keep, err.
func work(calls *int, resp idem.Response, keep bool, err error) idem.TxWork {
	return func(ctx context.Context) (idem.Response, bool, error) {
		*calls++
		if ctx == nil {
			return idem.Response{}, false, errors.New("idemtest: TxWork got a nil context")
		}
		return resp, keep, err
	}
}

func testTxKeep(t *testing.T, e *env, s idem.TxStore) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.clock.Advance(time.Second)
	completedAt := e.clock.Now()
	resp := sampleResponse()
	calls := 0
	kept, err := s.CompleteTx(e.ctx, ref(c), work(&calls, resp, true, nil))
	if err != nil || !kept {
		t.Fatalf("CompleteTx = %v, %v; want true, nil", kept, err)
	}
	if calls != 1 {
		t.Errorf("work ran %d times, want 1", calls)
	}
	want := c.Record
	want.State = idem.StateCompleted
	want.Response = &resp
	want.CompletedAt = completedAt
	checkRecord(t, "Get after CompleteTx", e.get(req.Scope, req.Key), want)
	dup := e.claim(req)
	if dup.Outcome != idem.Completed {
		t.Fatalf("Claim after CompleteTx = %v, want completed", dup.Outcome)
	}
	checkRecord(t, "duplicate Claim after CompleteTx", dup.Record, want)
}

func testTxNotKept(t *testing.T, e *env, s idem.TxStore) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	calls := 0
	kept, err := s.CompleteTx(e.ctx, ref(c), work(&calls, idem.Response{Status: http.StatusServiceUnavailable}, false, nil))
	if err != nil || kept {
		t.Fatalf("CompleteTx with keep=false = %v, %v; want false, nil", kept, err)
	}
	if calls != 1 {
		t.Errorf("work ran %d times, want 1", calls)
	}
	checkRecord(t, "Get after a CompleteTx that did not keep", e.get(req.Scope, req.Key), c.Record)
	if err := e.store.Release(e.ctx, ref(c)); err != nil {
		t.Fatalf("Release after keep=false: %v", err)
	}
	if again := e.acquire(req); again.TookOver {
		t.Error("Claim after Release reports TookOver")
	}
}

func testTxWorkError(t *testing.T, e *env, s idem.TxStore) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	errWork := errors.New("payment provider timed out")
	calls := 0
	kept, err := s.CompleteTx(e.ctx, ref(c), work(&calls, sampleResponse(), true, errWork))
	if !errors.Is(err, errWork) || kept {
		t.Fatalf("CompleteTx with a failing work = %v, %v; want false and the work's error", kept, err)
	}
	checkRecord(t, "Get after a failed work", e.get(req.Scope, req.Key), c.Record)
	if err := e.store.Release(e.ctx, ref(c)); err != nil {
		t.Fatalf("Release after a failed work: %v", err)
	}
	e.wantNotFound(req.Scope, req.Key)
}

func testTxLeaseTakenOver(t *testing.T, e *env, s idem.TxStore) {
	req := e.req("k", "fp")
	old := e.acquire(req)
	e.clock.Advance(lease)
	cur := e.acquire(req)
	if !cur.TookOver {
		t.Fatal("expected a takeover")
	}
	calls := 0
	kept, err := s.CompleteTx(e.ctx, ref(old), work(&calls, sampleResponse(), true, nil))
	if !errors.Is(err, idem.ErrLeaseLost) || kept {
		t.Fatalf("CompleteTx with a taken-over token = %v, %v; want false, ErrLeaseLost", kept, err)
	}
	checkRecord(t, "Get after the stale CompleteTx", e.get(req.Scope, req.Key), cur.Record)
}

func testTxReleased(t *testing.T, e *env, s idem.TxStore) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	if err := e.store.Release(e.ctx, ref(c)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	calls := 0
	kept, err := s.CompleteTx(e.ctx, ref(c), work(&calls, sampleResponse(), true, nil))
	if !errors.Is(err, idem.ErrLeaseLost) || kept {
		t.Fatalf("CompleteTx of a released key = %v, %v; want false, ErrLeaseLost", kept, err)
	}
	e.wantNotFound(req.Scope, req.Key)
}

func testTxTwice(t *testing.T, e *env, s idem.TxStore) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	first := sampleResponse()
	calls := 0
	if kept, err := s.CompleteTx(e.ctx, ref(c), work(&calls, first, true, nil)); err != nil || !kept {
		t.Fatalf("CompleteTx = %v, %v; want true, nil", kept, err)
	}
	completedAt := e.clock.Now()
	e.clock.Advance(time.Second)
	// A retry with the same token finds its own completion: it succeeds
	// and changes nothing.
	kept, err := s.CompleteTx(e.ctx, ref(c), work(&calls, idem.Response{Status: http.StatusTeapot}, true, nil))
	if err != nil || !kept {
		t.Fatalf("second CompleteTx with the same token = %v, %v; want true, nil", kept, err)
	}
	want := c.Record
	want.State = idem.StateCompleted
	want.Response = &first
	want.CompletedAt = completedAt
	checkRecord(t, "Get after a second CompleteTx", e.get(req.Scope, req.Key), want)
}

var waiterTests = []struct {
	name string
	run  func(t *testing.T, e *env, w idem.Waiter)
}{
	{"WakesOnComplete", func(t *testing.T, e *env, w idem.Waiter) {
		testWake(t, e, w, func(c idem.Claim) error { return e.store.Complete(e.ctx, ref(c), sampleResponse()) })
	}},
	{"WakesOnRelease", func(t *testing.T, e *env, w idem.Waiter) {
		testWake(t, e, w, func(c idem.Claim) error { return e.store.Release(e.ctx, ref(c)) })
	}},
	{"WakesOnYield", func(t *testing.T, e *env, w idem.Waiter) {
		rec, ok := w.(idem.Recoverer)
		if !ok {
			t.Skip("the store does not implement idem.Recoverer")
		}
		testWake(t, e, w, func(c idem.Claim) error { return rec.Yield(e.ctx, ref(c)) })
	}},
	{"WakesOnYieldEarlier", func(t *testing.T, e *env, w idem.Waiter) {
		r, ok := w.(idem.Restarter)
		if !ok {
			t.Skip("the store does not implement idem.Restarter")
		}
		testWakeReq(t, e, w, e.holderReq("k", replicaA1), func(c idem.Claim) error {
			n, err := r.YieldEarlier(e.ctx, replicaA2)
			if err == nil && n != 1 {
				err = fmt.Errorf("YieldEarlier = %d; want 1", n)
			}
			return err
		})
	}},
	{"Cancelled", testWaitCancelled},
}

// testWake checks that a duplicate waiting on a key in flight returns once
// the holder changes it. The waiter may start waiting before or after the
// change; either way it must return, so no wake-up may be lost.
func testWake(t *testing.T, e *env, w idem.Waiter, change func(idem.Claim) error) {
	testWakeReq(t, e, w, e.req("k", "fp"), change)
}

// testWakeReq is testWake with the claim of req.
func testWakeReq(t *testing.T, e *env, w idem.Waiter, req idem.ClaimRequest, change func(idem.Claim) error) {
	c := e.acquire(req)

	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(started)
		done <- w.WaitChange(ctx, req.Scope, req.Key)
	}()
	<-started
	if err := change(c); err != nil {
		t.Fatalf("changing the key: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WaitChange after the key changed = %v, want nil within %v", err, waitLimit)
	}
}

func testWaitCancelled(t *testing.T, e *env, w idem.Waiter) {
	req := e.req("k", "fp")
	e.acquire(req)

	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if err := w.WaitChange(ctx, req.Scope, req.Key); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitChange with a cancelled context = %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithCancel(e.ctx)
	defer cancel()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(started)
		// Returns without an error are allowed (spurious wake-ups); the
		// waiter then waits again, as a caller would, until the
		// cancellation ends it.
		for {
			if err := w.WaitChange(ctx, req.Scope, req.Key); err != nil {
				done <- err
				return
			}
		}
	}()
	<-started
	cancel()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WaitChange after cancellation = %v, want context.Canceled", err)
		}
	case <-timer.C:
		t.Fatalf("WaitChange did not return within %v of its context being cancelled", waitLimit)
	}
}

var txClaimerTests = []struct {
	name string
	run  func(t *testing.T, e *env, s idem.TxClaimer)
}{
	{"Keep", testClaimTxKeep},
	{"NotKeptLeavesNothing", testClaimTxNotKept},
	{"WorkErrorLeavesNothing", testClaimTxWorkError},
	{"PanicLeavesNothing", testClaimTxPanic},
	{"AnswersWithoutWork", testClaimTxAnswers},
	{"UnseenAnswersWithoutWork", testClaimTxUnseen},
	{"TakesOverAnEndedLease", testClaimTxTakeover},
	{"ExpiredKeyAnew", testClaimTxExpired},
	{"ConcurrentOnce", testClaimTxConcurrent},
	{"Invalid", testClaimTxInvalid},
}

// claimedWork returns a ClaimedWork that counts its calls, keeps the claim
// it ran under, and answers resp, keep, err.
func claimedWork(calls *int, got *idem.Claim, resp idem.Response, keep bool, err error) idem.ClaimedWork {
	return func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		*calls++
		if got != nil {
			*got = c
		}
		if ctx == nil {
			return idem.Response{}, false, errors.New("idemtest: ClaimedWork got a nil context")
		}
		return resp, keep, err
	}
}

// claimTx runs ClaimTx and fails the test on an error other than want.
func (e *env) claimTx(s idem.TxClaimer, req idem.ClaimRequest, w idem.ClaimedWork, want error) (idem.Claim, bool) {
	e.t.Helper()
	c, kept, err := s.ClaimTx(e.ctx, req, time.Second, w)
	if !errors.Is(err, want) {
		e.t.Fatalf("ClaimTx(%q) = %v, %v, %v; want error %v", req.Key, c.Outcome, kept, err, want)
	}
	return c, kept
}

func testClaimTxKeep(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	resp := sampleResponse()
	calls := 0
	var under idem.Claim
	c, kept := e.claimTx(s, req, claimedWork(&calls, &under, resp, true, nil), nil)
	if c.Outcome != idem.Acquired || !kept || c.TookOver || c.Token == 0 {
		t.Fatalf("ClaimTx of a new key = %+v, kept %v; want acquired and kept", c, kept)
	}
	if calls != 1 || under.Outcome != idem.Acquired || under.Token != c.Token || under.Record.State != idem.StateInFlight {
		t.Errorf("work ran %d times under %+v; want once, under the acquired claim", calls, under)
	}
	want := c.Record
	want.State, want.Response, want.CompletedAt = idem.StateCompleted, &resp, e.clock.Now()
	checkRecord(t, "Get after a kept ClaimTx", e.get(req.Scope, req.Key), want)
	if dup := e.claim(req); dup.Outcome != idem.Completed {
		t.Errorf("Claim after a kept ClaimTx = %v, want completed", dup.Outcome)
	}
}

func testClaimTxNotKept(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	calls := 0
	c, kept := e.claimTx(s, req, claimedWork(&calls, nil, idem.Response{Status: http.StatusServiceUnavailable}, false, nil), nil)
	if c.Outcome != idem.Acquired || kept || calls != 1 {
		t.Fatalf("ClaimTx with keep=false = %v, kept %v, %d calls; want acquired, not kept, one call", c.Outcome, kept, calls)
	}
	e.wantNotFound(req.Scope, req.Key)
	if again := e.acquire(req); again.TookOver {
		t.Error("a claim after a ClaimTx that kept nothing took over: the claim must have rolled back")
	}
}

func testClaimTxWorkError(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	errWork := idem.Permanent(errors.New("payment provider refused"))
	calls := 0
	_, kept, err := s.ClaimTx(e.ctx, req, time.Second, claimedWork(&calls, nil, sampleResponse(), true, errWork))
	if err != errWork || kept {
		t.Fatalf("ClaimTx with a failing work = %v, %v; want false and the work's error unchanged", kept, err)
	}
	e.wantNotFound(req.Scope, req.Key)
}

func testClaimTxPanic(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the work's panic to go on", p)
			}
		}()
		s.ClaimTx(e.ctx, req, time.Second, func(context.Context, idem.Claim) (idem.Response, bool, error) { panic("boom") })
	}()
	e.wantNotFound(req.Scope, req.Key)
	calls := 0
	if c, kept := e.claimTx(s, req, claimedWork(&calls, nil, sampleResponse(), true, nil), nil); c.Outcome != idem.Acquired || !kept {
		t.Errorf("ClaimTx after a panic = %v, kept %v; want the key free and kept now", c.Outcome, kept)
	}
}

func testClaimTxAnswers(t *testing.T, e *env, s idem.TxClaimer) { claimTxAnswers(t, e, s, false) }

// testClaimTxUnseen: ClaimTx answers as it does when the request is marked
// Unseen (the caller saw no sign of the key), which only lets a store skip
// a read.
func testClaimTxUnseen(t *testing.T, e *env, s idem.TxClaimer) { claimTxAnswers(t, e, s, true) }

func claimTxAnswers(t *testing.T, e *env, s idem.TxClaimer, unseen bool) {
	done := e.req("done", "fp")
	c := e.acquire(done)
	e.complete(ref(c), sampleResponse())
	flying := e.req("flying", "fp")
	e.acquire(flying)
	calls := 0
	for _, tc := range []struct {
		what string
		req  idem.ClaimRequest
		want idem.Outcome
	}{
		{"a completed key", done, idem.Completed},
		{"another request under a completed key", e.req("done", "other"), idem.Mismatch},
		{"a key in flight under a live lease", flying, idem.InFlight},
		{"another request under a key in flight", e.req("flying", "other"), idem.Mismatch},
	} {
		tc.req.Unseen = unseen
		got, kept := e.claimTx(s, tc.req, claimedWork(&calls, nil, sampleResponse(), true, nil), nil)
		if got.Outcome != tc.want || kept {
			t.Errorf("ClaimTx (Unseen %v) of %s = %v, kept %v; want %v", unseen, tc.what, got.Outcome, kept, tc.want)
		}
	}
	if calls != 0 {
		t.Errorf("work ran %d times for claims that did not acquire", calls)
	}
	if rec := e.get(done.Scope, done.Key); rec.State != idem.StateCompleted || rec.Token != c.Token {
		t.Errorf("the completed key changed: %+v", rec)
	}
}

func testClaimTxTakeover(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	old := e.acquire(req)
	e.clock.Advance(lease)
	calls := 0
	c, kept := e.claimTx(s, req, claimedWork(&calls, nil, sampleResponse(), true, nil), nil)
	if c.Outcome != idem.Acquired || !c.TookOver || !kept || c.Token <= old.Token {
		t.Fatalf("ClaimTx after the lease ended = %+v, kept %v; want a takeover with a newer token, kept", c, kept)
	}
	if err := e.store.Complete(e.ctx, ref(old), sampleResponse()); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("the old holder's Complete after the takeover = %v, want ErrLeaseLost", err)
	}
	if rec := e.get(req.Scope, req.Key); rec.State != idem.StateCompleted || rec.Token != c.Token {
		t.Errorf("record after the takeover = %+v, want completed under the new token", rec)
	}
}

func testClaimTxExpired(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.complete(ref(c), sampleResponse())
	e.clock.Advance(ttl + time.Second)
	calls := 0
	again, kept := e.claimTx(s, e.req("k", "new"), claimedWork(&calls, nil, sampleResponse(), true, nil), nil)
	if again.Outcome != idem.Acquired || !kept || calls != 1 {
		t.Fatalf("ClaimTx of an expired key = %v, kept %v, %d calls; want a fresh claim", again.Outcome, kept, calls)
	}
	if rec := e.get(req.Scope, req.Key); rec.Fingerprint != "new" {
		t.Errorf("record = %+v, want the new request's", rec)
	}
}

// testClaimTxConcurrent runs 16 ClaimTx of one new key at once: one work
// runs, every other call answers Completed or InFlight.
func testClaimTxConcurrent(t *testing.T, e *env, s idem.TxClaimer) {
	req := e.req("k", "fp")
	const n = 16
	var (
		mu       sync.Mutex
		ran      int
		outcomes = map[idem.Outcome]int{}
		wg       sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			c, _, err := s.ClaimTx(e.ctx, req, waitLimit, func(context.Context, idem.Claim) (idem.Response, bool, error) {
				mu.Lock()
				ran++
				mu.Unlock()
				return sampleResponse(), true, nil
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("concurrent ClaimTx: %v", err)
				return
			}
			outcomes[c.Outcome]++
		})
	}
	wg.Wait()
	if ran != 1 || outcomes[idem.Acquired] != 1 || outcomes[idem.Completed]+outcomes[idem.InFlight] != n-1 {
		t.Errorf("%d concurrent ClaimTx: work ran %d times, outcomes %v; want once, one acquired, the rest completed or in flight", n, ran, outcomes)
	}
}

func testClaimTxInvalid(t *testing.T, e *env, s idem.TxClaimer) {
	calls := 0
	bad := e.req("k", "fp")
	bad.Lease = 0
	if _, _, err := s.ClaimTx(e.ctx, bad, time.Second, claimedWork(&calls, nil, sampleResponse(), true, nil)); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("ClaimTx with no lease = %v, want idem.ErrInvalidArgument", err)
	}
	if _, _, err := s.ClaimTx(e.ctx, e.req("k", "fp"), time.Second, nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("ClaimTx with nil work = %v, want idem.ErrInvalidArgument", err)
	}
	if calls != 0 {
		t.Errorf("work ran %d times for invalid calls", calls)
	}
	e.wantNotFound("", "k")
}
