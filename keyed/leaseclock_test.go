package keyed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// lateClaims is a store whose claims reach it late: each says so on
// entered, then waits until release before it claims, by the store's
// clock, which the test may move meanwhile (a claim queued behind SQLite's
// writer). grant, when not zero, is the lease it grants in place of the
// one asked for. Its renewals fail, so that a test sees when the heartbeat
// gives a lease up.
type lateClaims struct {
	*idemmem.Store
	entered, release chan struct{}
	grant            time.Duration
}

func (s *lateClaims) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	s.entered <- struct{}{}
	<-s.release
	if s.grant != 0 {
		req.Lease = s.grant
	}
	return s.Store.Claim(ctx, req)
}

func (*lateClaims) Renew(context.Context, idem.Ref, time.Duration) (time.Time, error) {
	return time.Time{}, errors.New("dial tcp: connection refused")
}

// storeOnly is a store that says nothing of its clock: only idem.Store's
// methods are promoted.
type storeOnly struct{ idem.Store }

// The heartbeat counts a lease from when the store began it, read on the
// store's clock, when that clock is the engine's own (idem.LocalClock):
// a claim that waited long before the store ran it has its whole lease
// left when it returns, and its execution is given up (its renewals all
// failing) only at the last tick that leaves a sixth of that lease. A
// store that grants less than the lease asked for has its lease counted as
// it granted it, never longer. Where the store's clock is its own, or not
// the engine's, the lease counts from when its claim was sent: the store
// began it later, so it ends no sooner.
func TestHeartbeatCountsTheLeaseAsTheStoreBeganIt(t *testing.T) {
	t.Parallel()
	const lease, tick = 12 * time.Second, 2 * time.Second
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name string
		// wait is how long the claim waits before the store runs it,
		// grant the lease the store grants (zero: the one asked for).
		wait, grant time.Duration
		// own: the store says nothing of its clock; other: it decides by
		// a clock other than the engine's.
		own, other bool
		// cancel is when the execution is given up, after its claim was
		// sent.
		cancel time.Duration
	}{
		{name: "the engine's clock, a claim that waited", wait: 10 * time.Second, cancel: 20 * time.Second},
		{name: "the engine's clock, a shorter lease granted", grant: lease / 2, cancel: 4 * time.Second},
		{name: "a store that says nothing of its clock", wait: 10 * time.Second, own: true, cancel: 12 * time.Second},
		{name: "a store on another clock", wait: 10 * time.Second, other: true, cancel: 12 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(t0)
			storeClock := clock
			if c.other {
				storeClock = idemmem.NewClock(t0)
			}
			late := &lateClaims{Store: idemmem.NewStore(&idemmem.Config{Clock: storeClock}),
				entered: make(chan struct{}, 1), release: make(chan struct{}), grant: c.grant}
			var store idem.Store = late
			if c.own {
				store = storeOnly{late}
			}
			timers := countedTimers{clock, make(chan struct{}, 1)}
			eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: timers, Lease: lease, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ctxs := make(chan context.Context, 1)
			out := make(chan keyed.Outcome, 1)
			fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("k"))
			go func() {
				out <- eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: fp}, &funcFace{run: func(ctx context.Context) keyed.Ran {
					ctxs <- ctx
					<-ctx.Done()
					return keyed.Ran{Status: 503, Failure: "timed out"}
				}})
			}()
			receive(t, late.entered, "the claim was not sent")
			clock.Advance(c.wait)
			close(late.release)
			ctx := receive(t, ctxs, "the handler did not run")
			receive(t, timers.set, "no tick was set at the claim")
			for {
				clock.Advance(tick)
				receive(t, timers.set, "no next tick was set")
				at := clock.Now().Sub(t0)
				if at < c.cancel {
					if ctx.Err() != nil {
						t.Fatalf("the handler was cancelled %v after its claim was sent, %v after the store ran it (cause %v); want it running until %v after it was sent",
							at, at-c.wait, context.Cause(ctx), c.cancel)
					}
					continue
				}
				if ctx.Err() == nil {
					t.Fatalf("the handler runs on %v after its claim was sent, its lease unrenewed; want it cancelled at %v", at, c.cancel)
				}
				break
			}
			if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				t.Fatalf("cause %v; want one that wraps idem.ErrLeaseLost", context.Cause(ctx))
			}
			if o := receive(t, out, "Serve did not return once the handler did"); o == keyed.OutcomeExecuted {
				t.Fatalf("outcome %v; want the execution failed", o)
			}
		})
	}
}
