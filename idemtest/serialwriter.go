package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// WriterControl is what TestSerialWriter needs of a store whose write
// transactions run one at a time, and commit together when they queue one
// behind the other (idemsqlite's group commit): a way to hold the writer,
// and to see who waits for it.
type WriterControl struct {
	// Hold begins, in a goroutine, a write transaction of the store's
	// database that takes its turn on the writer behind whatever waits for
	// it already, writes, and then holds the writer until release is
	// called; then it commits. With fail, its commit fails, and with it
	// that of every transaction committing together with it (a deferred
	// constraint it breaks, say). held is closed once it holds the
	// writer; done receives its result.
	Hold func(ctx context.Context, fail bool) (held <-chan struct{}, release func(), done <-chan error)
	// Waiting returns once exactly n callers wait for the writer.
	Waiting func(t *testing.T, n int)
}

// TestSerialWriter runs, as subtests of t, what a store whose writes queue
// for one writer and commit in groups must still promise:
//
//   - A claim that waits, after reading its clock, for the commit it shares
//     with a slow transaction behind it gets its whole lease, counted from
//     when it returns: no duplicate takes the key over as soon as it is
//     acknowledged.
//   - A completion that finds its lease lost to a takeover in the same
//     group does not report idem.ErrLeaseLost before that group has
//     committed: when the group fails, the takeover never happened, and the
//     completion returns the group's failure (the key is still its own).
//
// newStore is called once per subtest and returns a fresh store reading the
// time from clock, whose transactions keep sharing a commit as long as
// others queue behind them, and its WriterControl.
func TestSerialWriter(t *testing.T, newStore func(t *testing.T, clock idem.Clock) (idem.SerialWriter, WriterControl)) {
	t.Helper()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *env, s idem.SerialWriter, w WriterControl)
	}{
		{"ClaimBehindSlowMemberGetsWholeLease", testClaimBehindSlowMember},
		{"LostLeaseReportedAfterGroup", testLostLeaseAfterGroup},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var w WriterControl
			e := newEnv(t, func(t *testing.T, clock idem.Clock) idem.Store {
				var s idem.SerialWriter
				s, w = newStore(t, clock)
				return s
			})
			tc.run(t, e, e.store.(idem.SerialWriter), w)
		})
	}
}

// wait receives from ch, failing the test after waitBound.
func wait[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitBound):
		t.Fatalf("%s did not happen within %v", what, waitBound)
		var zero T
		return zero
	}
}

const waitBound = 10 * time.Second

type claimResult struct {
	c   idem.Claim
	err error
}

func testClaimBehindSlowMember(t *testing.T, e *env, s idem.SerialWriter, w WriterControl) {
	req := e.req("k", "fp")
	req.Unseen = true // straight to the writer
	held1, release1, done1 := w.Hold(e.ctx, false)
	wait(t, "the first transaction's hold", held1)
	claimed := make(chan claimResult, 1)
	go func() {
		c, err := s.Claim(e.ctx, req)
		claimed <- claimResult{c, err}
	}()
	w.Waiting(t, 1)
	held2, release2, done2 := w.Hold(e.ctx, false)
	w.Waiting(t, 2)
	release1()
	// The slow one behind the claim holds the writer: the claim has had
	// its turn, read the clock and written, and waits for the commit.
	wait(t, "the second transaction's hold", held2)
	e.clock.Advance(3 * lease)
	release2()
	r := wait(t, "the claim", claimed)
	if err := wait(t, "the first transaction", done1); err != nil {
		t.Fatalf("the first transaction: %v", err)
	}
	if err := wait(t, "the second transaction", done2); err != nil {
		t.Fatalf("the second transaction: %v", err)
	}
	if r.err != nil || r.c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v; want acquired", r.c.Outcome, r.err)
	}
	now := e.clock.Now()
	if end := r.c.Record.LeaseExpiresAt; end.Before(now.Add(lease)) {
		t.Errorf("the claim returned with its lease ending at %v, %v after it returned; want its whole lease, %v",
			end, end.Sub(now), lease)
	}
	if got := e.get("s", "k"); !got.LeaseExpiresAt.Equal(r.c.Record.LeaseExpiresAt) || got.Token != r.c.Token {
		t.Errorf("Get = lease end %v, token %d; want what the claim returned, %v, %d",
			got.LeaseExpiresAt, got.Token, r.c.Record.LeaseExpiresAt, r.c.Token)
	}
	if dup := e.claim(e.req("k", "fp")); dup.Outcome != idem.InFlight {
		t.Fatalf("a duplicate right after the claim returned = %v (took over %v); want in_flight", dup.Outcome, dup.TookOver)
	}
}

func testLostLeaseAfterGroup(t *testing.T, e *env, s idem.SerialWriter, w WriterControl) {
	holder := e.acquire(e.req("k", "fp"))
	e.clock.Advance(lease + time.Millisecond)
	held, release, done := w.Hold(e.ctx, true)
	wait(t, "the failing transaction's hold", held)
	takeover := make(chan claimResult, 1)
	go func() {
		c, err := s.Claim(e.ctx, e.req("k", "fp"))
		takeover <- claimResult{c, err}
	}()
	w.Waiting(t, 1)
	type completion struct {
		kept bool
		err  error
	}
	completed := make(chan completion, 1)
	go func() {
		kept, err := s.CompleteTx(e.ctx, ref(holder), func(ctx context.Context) (idem.Response, bool, error) {
			return idem.Response{Status: 201}, true, nil
		})
		completed <- completion{kept, err}
	}()
	w.Waiting(t, 2)
	release()
	if err := wait(t, "the failing transaction", done); err == nil {
		t.Fatal("the transaction meant to fail its group committed")
	}
	tk := wait(t, "the takeover", takeover)
	if tk.err == nil {
		t.Errorf("the takeover in the failed group returned %v (token %d), nil; want the group's error", tk.c.Outcome, tk.c.Token)
	}
	c := wait(t, "the completion", completed)
	switch {
	case errors.Is(c.err, idem.ErrLeaseLost):
		t.Errorf("CompleteTx = %v: the lease was reported lost to a takeover that never committed", c.err)
	case c.err == nil || c.kept:
		t.Errorf("CompleteTx in the failed group = kept %v, %v; want the group's error", c.kept, c.err)
	}
	got := e.get("s", "k")
	if got.State != idem.StateInFlight || got.Token != holder.Token {
		t.Fatalf("after the failed group: %v under token %d; want in flight under the holder's %d", got.State, got.Token, holder.Token)
	}
	// The key is still the holder's: nobody took it over, so it completes.
	if kept, err := s.CompleteTx(e.ctx, ref(holder), func(ctx context.Context) (idem.Response, bool, error) {
		return idem.Response{Status: 201}, true, nil
	}); err != nil || !kept {
		t.Fatalf("the holder's CompleteTx after the failed group = kept %v, %v", kept, err)
	}
}
