package idemtest

import (
	"context"
	"errors"
	"net/http"
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
	{"Cancelled", testWaitCancelled},
}

// testWake checks that a duplicate waiting on a key in flight returns once
// the holder changes it. The waiter may start waiting before or after the
// change; either way it must return, so no wake-up may be lost.
func testWake(t *testing.T, e *env, w idem.Waiter, change func(idem.Claim) error) {
	req := e.req("k", "fp")
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
