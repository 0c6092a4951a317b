package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// A duplicate refused while the key is in flight is told to retry when the
// holder's lease ends: the time left on it by the engine's clock, not a
// constant. (In the ClaimTx form the key's row is the claim's
// transaction's until it commits: no lease is known, and the duplicate is
// told to retry within the lease.)
func fcRetryAfterFromLease(t *testing.T, r *faceRun) {
	g := newGate()
	defer g.open()
	s := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		return Reply{Kind: Created, Body: "paid"}
	}, nil)
	dup := r.serve(func(ctx context.Context, body string) Reply {
		t.Errorf("a duplicate ran while the first was in flight")
		return Reply{Kind: Created, Body: "twice"}
	}, func(c *FaceConfig) { c.Engine.InflightWait = -1 })
	first := make(chan Answer, 1)
	go func() { first <- s.Do(t.Context(), "k", "pay") }()
	g.awaitEntered(t)
	// A quarter into the lease: the heartbeat has ticked (every sixth) but
	// renews nothing before a third; three quarters of it are left.
	r.clock.Advance(faceLease / 4)
	a := dup.Do(t.Context(), "k", "pay")
	left := faceLease * 3 / 4
	if r.form.claimsInTx {
		if a.Kind != InFlight || a.RetryAfter < time.Second || a.RetryAfter > faceLease {
			t.Fatalf("a duplicate: %s; want in flight, retry within the lease", a)
		}
	} else if a.Kind != InFlight || a.RetryAfter < left || a.RetryAfter >= left+time.Second {
		t.Fatalf("a duplicate with %v left on the holder's lease: %s; want in flight, retry after %v (to the second)", left, a, left)
	}
	g.open()
	want(t, "the first", <-first, Created, "paid", false)
}

// abandon makes n keys ("k0"…) abandoned after their recovery point: each
// one's execution saves "charging" and dies (panics) in the separate form,
// its lease yielded. It returns the server that served them.
func abandon(t *testing.T, r *faceRun, n int) Server {
	t.Helper()
	s := r.serve(func(ctx context.Context, body string) Reply {
		if err := keyed.SaveRecovery(ctx, "charging", []byte(body)); err != nil {
			t.Errorf("SaveRecovery: %v", err)
		}
		panic("the process died after the charge")
	}, func(c *FaceConfig) { c.Engine.SeparateTx = true; c.Engine.InflightWait = -1 })
	for i := range n {
		s.Do(t.Context(), fmt.Sprintf("k%d", i), "pay")
	}
	wantCount(t, s, keyed.OutcomeUnfinished, uint64(n))
	return s
}

// The Completer resumes a round's keys concurrently, Parallel at once and
// never more: with Parallel 2 and five abandoned keys whose resumes wait
// to be let go one by one, two are resumed at once before any ends, a
// third begins only once one has ended, and never three run at once.
func fcCompleterParallel(t *testing.T, r *faceRun) {
	if !r.form.points {
		t.Skipf("%T keeps no recovery points", r.store)
	}
	const n, parallel = 5, 2
	s := abandon(t, r, n)
	entered, release := make(chan struct{}, n), make(chan struct{})
	var now, most atomic.Int64
	comp, err := s.NewCompleter(keyed.CompleterConfig{Every: time.Hour, Timeout: time.Minute, Parallel: parallel},
		func(ctx context.Context, ex keyed.Execution) (Reply, error) {
			in := now.Add(1)
			for m := most.Load(); in > m && !most.CompareAndSwap(m, in); m = most.Load() {
			}
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			now.Add(-1)
			return Reply{Kind: Created, Body: "finished"}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		finished, err := comp.RunOnce(t.Context())
		if err != nil {
			t.Errorf("RunOnce: %v", err)
		}
		done <- finished
	}()
	await := func(what string) {
		t.Helper()
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not begin within 30s", what)
		}
	}
	for range parallel {
		await("a resume, while none has ended,")
	}
	for range n - parallel {
		release <- struct{}{}
		await("a resume, once one had ended,")
	}
	for range parallel {
		release <- struct{}{}
	}
	if finished := <-done; finished != n {
		t.Fatalf("RunOnce finished %d keys, want %d", finished, n)
	}
	if m := most.Load(); m != parallel {
		t.Fatalf("at most %d resumes ran at once, want %d (Parallel)", m, parallel)
	}
	for i := range n {
		want(t, "a client's retry", s.Do(t.Context(), fmt.Sprintf("k%d", i), "pay"), Created, "finished", true)
	}
}

// The Completer renews the lease of what it resumes: a resume that runs
// three times the lease keeps its key; a retry meanwhile is told it is in
// flight, never run; the resume's answer is kept.
func fcCompleterRenews(t *testing.T, r *faceRun) {
	if !r.form.points {
		t.Skipf("%T keeps no recovery points", r.store)
	}
	s := abandon(t, r, 1)
	dup := r.serve(func(ctx context.Context, body string) Reply {
		t.Errorf("the client's retry ran while the Completer resumed the key")
		return Reply{Kind: Created, Body: "twice"}
	}, func(c *FaceConfig) { c.Engine.InflightWait = -1 })
	g := newGate()
	defer g.open()
	comp, err := s.NewCompleter(keyed.CompleterConfig{Every: time.Hour, Timeout: time.Hour},
		func(ctx context.Context, ex keyed.Execution) (Reply, error) {
			g.wait()
			if err := ctx.Err(); err != nil {
				return Reply{}, fmt.Errorf("the resume's context ended while it ran: %w (%v)", err, context.Cause(ctx))
			}
			return Reply{Kind: Created, Body: "finished by the completer"}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		finished, _ := comp.RunOnce(t.Context())
		done <- finished
	}()
	g.awaitEntered(t)
	for i := range 3 * 6 {
		r.step("k0", stepRenewed)
		if i == 9 {
			if a := dup.Do(t.Context(), "k0", "pay"); a.Kind != InFlight {
				t.Fatalf("the client's retry after 1.5 leases of the resume: %s; want in flight", a)
			}
		}
	}
	g.open()
	if finished := <-done; finished != 1 || comp.Stats().Completed != 1 {
		t.Fatalf("RunOnce finished %d, stats %+v; want the key finished", finished, comp.Stats())
	}
	want(t, "the client's retry", dup.Do(t.Context(), "k0", "pay"), Created, "finished by the completer", true)
}

// completeRefused is a store whose Complete fails (the store unreachable
// for it), the rest working. It offers only the Recoverer face.
type completeRefused struct{ idem.Recoverer }

func (completeRefused) Complete(context.Context, idem.Ref, idem.Response) error {
	return errors.New("dial tcp: connection refused")
}

// A resume whose answer cannot be kept counts as unknown: the key stays in
// flight with its point, never released, Stats counts it Failed and
// Unknown, and the client's retry is told the key is in flight.
func fcCompleterAnswerNotKept(t *testing.T, r *faceRun) {
	rs, ok := r.store.(idem.Recoverer)
	if !ok {
		t.Skipf("%T keeps no recovery points", r.store)
	}
	abandon(t, r, 1)
	s := r.serve(func(ctx context.Context, body string) Reply {
		t.Errorf("the client's retry ran")
		return Reply{Kind: Created, Body: "twice"}
	}, func(c *FaceConfig) { c.Engine.Store = completeRefused{rs}; c.Engine.InflightWait = -1 })
	comp, err := s.NewCompleter(keyed.CompleterConfig{Every: time.Hour, Timeout: time.Minute},
		func(ctx context.Context, ex keyed.Execution) (Reply, error) {
			return Reply{Kind: Created, Body: "finished"}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if finished, err := comp.RunOnce(t.Context()); finished != 0 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want nothing finished", finished, err)
	}
	if st := comp.Stats(); st.Unknown != 1 || st.Failed != 1 || st.Completed != 0 {
		t.Fatalf("stats %+v; want one unknown outcome, one failure, nothing completed", st)
	}
	rec, err := r.record("k0")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the key: %+v, %v; want it in flight with its point", rec, err)
	}
	if a := s.Do(t.Context(), "k0", "pay"); a.Kind != InFlight {
		t.Fatalf("the client's retry: %s; want in flight (the completer's lease)", a)
	}
}
