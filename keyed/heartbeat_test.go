package keyed_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// slowRenewals is a store whose renewals reach it late: one sent before
// the execution yields its key arrives after the Yield (or, if the engine
// waits for it, ends with its context).
type slowRenewals struct {
	*idemmem.Store
	entered, done chan struct{}
	yieldOnce     sync.Once
	yielded       chan struct{}
}

func (s *slowRenewals) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	defer close(s.done)
	close(s.entered)
	select {
	case <-s.yielded:
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	return s.Store.Renew(ctx, ref, lease)
}

func (s *slowRenewals) Yield(ctx context.Context, ref idem.Ref) error {
	err := s.Store.Yield(ctx, ref)
	s.yieldOnce.Do(func() { close(s.yielded) })
	return err
}

// failingFace runs a handler that saves a recovery point, says it is
// running, waits to be let go and fails: a failure after a point.
type failingFace struct {
	running, letGo chan struct{}
	refused        keyed.Reason
}

func (f *failingFace) Run(ctx context.Context, inTx bool) keyed.Ran {
	if err := keyed.SaveRecovery(ctx, "charging", []byte("card")); err != nil {
		panic(err)
	}
	close(f.running)
	<-f.letGo
	return keyed.Ran{Status: 500, Failure: "panicked"}
}
func (f *failingFace) Send()                            {}
func (f *failingFace) Replay(resp *idem.Response) error { return nil }
func (f *failingFace) Refuse(r keyed.Refusal)           { f.refused = r.Reason }

// An execution that fails after a recovery point yields its lease, so
// that the client's retry or a Completer takes the key over at once; a
// renewal of that lease still on its way must not give it back a live
// lease after the Yield, leaving the key held by nobody for a whole lease.
func TestYieldOutlastsARenewalInFlight(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := &slowRenewals{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}),
		entered: make(chan struct{}), done: make(chan struct{}), yielded: make(chan struct{})}
	const lease = 1200 * time.Millisecond // its sixth, the renewal's own time, is real time
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	face := &failingFace{running: make(chan struct{}), letGo: make(chan struct{})}
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("pay"))
	served := make(chan keyed.Outcome, 1)
	go func() { served <- eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: fp}, face) }()
	<-face.running
	clock.Advance(lease / 6)
	clock.Advance(lease / 6) // a third of the lease: the renewal is sent
	<-store.entered
	close(face.letGo)
	if o := <-served; o != keyed.OutcomeUnfinished || face.refused != keyed.RefusedUnfinished {
		t.Fatalf("outcome %s, refused %s; want unfinished", o, face.refused)
	}
	<-store.done
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if now := clock.Now(); rec.State != idem.StateInFlight || rec.Recovery.IsZero() || rec.LeaseExpiresAt.After(now) {
		t.Fatalf("the key is %s, point %q, its lease ending %v after its yield: a renewal sent before the yield gave it a live lease again",
			rec.State, rec.Recovery.Name, rec.LeaseExpiresAt.Sub(now))
	}
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: lease, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired || claim.Record.Recovery.Name != "charging" {
		t.Fatalf("the retry's claim: %v, %v; want it acquired at once, with the point", claim.Outcome, err)
	}
}

// countedTimers are a manual clock's timers, counted, so that a test
// tells when the heartbeat's tick has run: it sets the next one last.
type countedTimers struct {
	*idemmem.Clock
	set chan struct{}
}

func (c countedTimers) AfterFunc(d time.Duration, f func()) func() bool {
	defer func() { c.set <- struct{}{} }()
	return c.Clock.AfterFunc(d, f)
}

// refusedRenewals is a store whose renewals fail (unreachable, for them).
type refusedRenewals struct{ *idemmem.Store }

func (refusedRenewals) Renew(context.Context, idem.Ref, time.Duration) (time.Time, error) {
	return time.Time{}, errors.New("dial tcp: connection refused")
}

// funcFace runs run as its handler, and keeps what it answered.
type funcFace struct {
	run     func(ctx context.Context) keyed.Ran
	refused keyed.Reason
}

func (f *funcFace) Run(ctx context.Context, inTx bool) keyed.Ran { return f.run(ctx) }
func (f *funcFace) Send()                                        {}
func (f *funcFace) Replay(*idem.Response) error                  { return nil }
func (f *funcFace) Refuse(r keyed.Refusal)                       { f.refused = r.Reason }

// A handler whose lease cannot be renewed is cancelled while a sixth of
// its lease is left, whenever its claim fell between two of the
// heartbeat's ticks (which an earlier execution set going): not in the
// lease's last moments, when another may take the key over before the
// handler has noticed.
func TestUnrenewedLeaseCancelledWithASixthLeft(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := refusedRenewals{idemmem.NewStore(&idemmem.Config{Clock: clock})}
	const lease, tick = 12 * time.Second, 2 * time.Second
	timers := countedTimers{clock, make(chan struct{}, 1)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: timers, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// step moves the clock to the heartbeat's next tick, and returns once
	// the tick has run.
	step := func(d time.Duration) {
		clock.Advance(d)
		<-timers.set
	}
	serve := func(key idem.Key, run func(ctx context.Context) keyed.Ran) chan keyed.Outcome {
		out := make(chan keyed.Outcome, 1)
		fp := idem.NewFingerprint("POST", "/pay", "", "", []byte(key))
		go func() {
			out <- eng.Serve(context.Background(), keyed.Request{Key: key, Fingerprint: fp}, &funcFace{run: run})
		}()
		return out
	}
	// The first execution sets the heartbeat's ticks going, and holds its
	// key until the case ends.
	letGo, aRunning := make(chan struct{}), make(chan struct{})
	a := serve("a", func(ctx context.Context) keyed.Ran {
		close(aRunning)
		<-letGo
		return keyed.Ran{Status: 503}
	})
	defer func() { close(letGo); <-a }()
	<-aRunning
	<-timers.set // the first tick set
	// The second claims half a tick later.
	clock.Advance(tick / 2)
	ctxs := make(chan context.Context, 1)
	b := serve("b", func(ctx context.Context) keyed.Ran {
		ctxs <- ctx
		<-ctx.Done()
		return keyed.Ran{Status: 503, Failure: "timed out"}
	})
	bctx := <-ctxs
	rec, err := store.Get(t.Context(), "", "b")
	if err != nil {
		t.Fatal(err)
	}
	step(tick / 2)
	for bctx.Err() == nil {
		if !clock.Now().Before(rec.LeaseExpiresAt) {
			t.Fatalf("the lease ended at %v, its handler's context still live", rec.LeaseExpiresAt)
		}
		step(tick)
	}
	if left := rec.LeaseExpiresAt.Sub(clock.Now()); left < tick {
		t.Fatalf("the handler was cancelled with %v of its lease left (cause %v); want at least a sixth of it, %v", left, context.Cause(bctx), tick)
	}
	if !errors.Is(context.Cause(bctx), idem.ErrLeaseLost) {
		t.Fatalf("cause %v; want one that wraps idem.ErrLeaseLost", context.Cause(bctx))
	}
	// The cause says how long the lease went unrenewed and how long it had
	// left, for the operator reading the handler's error.
	left := rec.LeaseExpiresAt.Sub(clock.Now())
	if want := fmt.Sprintf("could not be renewed for %s, and ends in %s", lease-left, left); !strings.Contains(context.Cause(bctx).Error(), want) {
		t.Fatalf("cause %q; want it to say %q", context.Cause(bctx), want)
	}
	<-b
}

// A handler whose lease cannot be renewed runs until the last tick that
// still leaves it a sixth of its lease, not a tick sooner, when its claim
// fell on one of the heartbeat's ticks: until then a renewal sent again may
// still land, and stopping it earlier would fence a live handler for
// nothing. The first execution's claim sets the ticks going, so it falls
// on one.
func TestUnrenewedLeaseCancelledAtTheLastTickLeavingASixth(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := refusedRenewals{idemmem.NewStore(&idemmem.Config{Clock: clock})}
	const lease, tick = 12 * time.Second, 2 * time.Second
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
	ctx := <-ctxs
	<-timers.set // the first tick set, at the claim
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		clock.Advance(tick)
		<-timers.set
		if ctx.Err() != nil {
			t.Fatalf("the handler was cancelled at tick %d, with %v of its lease left (cause %v); want it running until a sixth, %v, is left", i, rec.LeaseExpiresAt.Sub(clock.Now()), context.Cause(ctx), tick)
		}
	}
	clock.Advance(tick)
	<-timers.set
	if ctx.Err() == nil {
		t.Fatalf("the handler runs on with %v of its lease left, none of it renewed; want it cancelled at this tick, the last before less than a sixth is left", rec.LeaseExpiresAt.Sub(clock.Now()))
	}
	if left := rec.LeaseExpiresAt.Sub(clock.Now()); left != tick {
		t.Fatalf("the handler was cancelled with %v of its lease left; want a sixth of it, %v", left, tick)
	}
	<-out
}

// stalledRenewal is a store whose first renewal reaches it too late: it
// ends with its context. The renewals after it are served; each one sent
// is said on sent.
type stalledRenewal struct {
	*idemmem.Store
	calls atomic.Int64
	sent  chan struct{}
}

func (s *stalledRenewal) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	defer func() { s.sent <- struct{}{} }()
	if s.calls.Add(1) == 1 {
		<-ctx.Done()
		return time.Time{}, ctx.Err()
	}
	return s.Store.Renew(ctx, ref, lease)
}

// A renewal that timed out is sent again without waiting for the engine's
// clock to move: its timeout is real time, and a clock that stands still
// until the lease is renewed (a test's, a process stalled) must not leave
// the lease unrenewed until it is given up.
func TestTimedOutRenewalSentAgain(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := &stalledRenewal{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}), sent: make(chan struct{}, 8)}
	const lease = 1200 * time.Millisecond // its sixth, the renewal's own time, is real time
	timers := countedTimers{clock, make(chan struct{}, 1)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: timers, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	letGo, running := make(chan struct{}), make(chan struct{})
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("pay"))
	served := make(chan keyed.Outcome, 1)
	go func() {
		served <- eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: fp}, &funcFace{run: func(ctx context.Context) keyed.Ran {
			close(running)
			select {
			case <-letGo:
				return keyed.Ran{Status: 503}
			case <-ctx.Done():
				return keyed.Ran{Status: 503, Failure: "cancelled"}
			}
		}})
	}()
	defer func() { <-served }()
	defer close(letGo)
	<-running
	<-timers.set // the first tick set
	clock.Advance(lease / 6)
	<-timers.set
	clock.Advance(lease / 6) // a third of the lease: the renewal is sent
	<-timers.set
	now := clock.Now()
	<-store.sent // the first, timed out
	select {
	case <-store.sent:
	case <-time.After(30 * time.Second):
		t.Fatalf("the renewal that timed out was not sent again within 30s while the clock stood still (%d sent)", store.calls.Load())
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateInFlight || !rec.LeaseExpiresAt.Equal(now.Add(lease)) {
		t.Fatalf("the key is %s, its lease ending %v from now; want in flight, renewed for %v", rec.State, rec.LeaseExpiresAt.Sub(now), lease)
	}
}

// fastRefusals is a store whose renewals fail at once; the real time of
// each is sent on calls.
type fastRefusals struct {
	*idemmem.Store
	calls chan time.Time
}

func (s fastRefusals) Renew(context.Context, idem.Ref, time.Duration) (time.Time, error) {
	select {
	case s.calls <- time.Now():
	default:
	}
	return time.Time{}, errors.New("dial tcp: connection refused")
}

// A renewal refused at once is sent again a tick of real time after it
// was sent, not at once: a store that refuses every renewal is not
// hammered with them while the lease runs out.
func TestRefusedRenewalSentAgainATickLater(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := fastRefusals{idemmem.NewStore(&idemmem.Config{Clock: clock}), make(chan time.Time, 2)}
	const lease = 1200 * time.Millisecond
	const tick = lease / 6 // the renewal's own time, real time
	timers := countedTimers{clock, make(chan struct{}, 1)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: timers, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	letGo, running := make(chan struct{}), make(chan struct{})
	served := make(chan keyed.Outcome, 1)
	go func() {
		served <- eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", nil)}, &funcFace{run: func(ctx context.Context) keyed.Ran {
			close(running)
			select {
			case <-letGo:
			case <-ctx.Done():
			}
			return keyed.Ran{Status: 503}
		}})
	}()
	defer func() { <-served }()
	defer close(letGo)
	<-running
	<-timers.set // the first tick set
	clock.Advance(tick)
	<-timers.set
	clock.Advance(tick) // a third of the lease: the renewal is sent
	<-timers.set
	first := <-store.calls
	var second time.Time
	select {
	case second = <-store.calls:
	case <-time.After(30 * time.Second):
		t.Fatal("the refused renewal was not sent again within 30s")
	}
	if gap := second.Sub(first); gap < tick/2 {
		t.Fatalf("the refused renewal was sent again %v after it; want about a tick, %v, later", gap, tick)
	}
}

// heldRenewal is a store whose first renewal is held until release is
// closed, as a renewal that stalls on its way (a slow store, a loaded
// machine) is; every renewal sent says so on sent, with its lease's new
// end.
type heldRenewal struct {
	*idemmem.Store
	calls   atomic.Int64
	release chan struct{}
	sent    chan time.Time
}

func (s *heldRenewal) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	first := s.calls.Add(1) == 1
	end, err := s.Store.Renew(ctx, ref, lease)
	s.sent <- end
	if first {
		<-s.release
	}
	return end, err
}

// A tick that finds a lease due while its renewal is still on its way
// sends none; once that renewal returns, the lease, counted from when it
// was sent, is due again, and is renewed at once rather than a tick
// later. On a clock that stands still until the lease is renewed (the
// face suite's), a tick later never came: the renewal returned after two
// ticks of the suite, and the lease was never renewed again.
func TestRenewalThatReturnsAfterATickIsFollowedAtOnce(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := &heldRenewal{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}), release: make(chan struct{}), sent: make(chan time.Time, 8)}
	const lease, tick = 12 * time.Second, 2 * time.Second
	timers := countedTimers{clock, make(chan struct{}, 1)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: timers, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctxs := make(chan context.Context, 1)
	done := make(chan struct{})
	out := make(chan keyed.Outcome, 1)
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("k"))
	go func() {
		out <- eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: fp}, &funcFace{run: func(ctx context.Context) keyed.Ran {
			ctxs <- ctx
			<-done
			return keyed.Ran{Status: 200, Keep: true, Answer: idem.Response{Status: 200}}
		}})
	}()
	ctx := receive(t, ctxs, "the handler did not run")
	receive(t, timers.set, "no tick was set at the claim") // the first tick set, at the claim
	for range 2 {
		clock.Advance(tick)
		receive(t, timers.set, "no next tick was set")
	}
	// A third of the lease: the renewal is sent, and held.
	if end := receive(t, store.sent, "no renewal was sent at a third of the lease"); !end.Equal(clock.Now().Add(lease)) {
		t.Fatalf("the first renewal ends the lease at %v, want %v", end, clock.Now().Add(lease))
	}
	// Two ticks while it is on its way: the lease is due at each, from
	// its claim, and neither sends a renewal.
	for range 2 {
		clock.Advance(tick)
		receive(t, timers.set, "no next tick was set")
	}
	select {
	case end := <-store.sent:
		t.Fatalf("a renewal (to %v) sent while the first was on its way", end)
	default:
	}
	close(store.release)
	select {
	case end := <-store.sent:
		if want := clock.Now().Add(lease); !end.Equal(want) {
			t.Fatalf("the renewal after the held one ends the lease at %v, want %v", end, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no renewal within 10s of the held one's return, the clock standing at a third of the lease after it was sent; want one at once")
	}
	if ctx.Err() != nil {
		t.Fatalf("the handler was cancelled: %v", context.Cause(ctx))
	}
	close(done)
	if o := receive(t, out, "Serve did not return once the handler did"); o != keyed.OutcomeExecuted {
		t.Fatalf("outcome %v, want executed", o)
	}
}

// The lease is due at a tick from the moment it is a third old by the
// engine's clock, and that holds for a tick that finds its renewal on its
// way: once that renewal returns, the lease, counted from when it was
// sent, is due again and is renewed at once. Here the engine's Clock and
// its Timers are apart (an injected clock beside timers of their own), so
// ticks can come while the clock stands still: the renewal is sent at a
// tick that finds the lease exactly a third old, the next tick finds it
// just as old, the renewal on its way; the clock then moves a third of the
// lease, and no tick comes after it.
func TestLeaseExactlyDueWhileItsRenewalIsOnItsWayIsRenewedOnItsReturn(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := idemmem.NewClock(start)
	store := &heldRenewal{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}), release: make(chan struct{}), sent: make(chan time.Time, 8)}
	const lease, tick, third = 12 * time.Second, 2 * time.Second, 4 * time.Second
	ticks := countedTimers{idemmem.NewClock(start), make(chan struct{}, 1)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: ticks, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctxs := make(chan context.Context, 1)
	done := make(chan struct{})
	out := make(chan keyed.Outcome, 1)
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("k"))
	go func() {
		out <- eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: fp}, &funcFace{run: func(ctx context.Context) keyed.Ran {
			ctxs <- ctx
			<-done
			return keyed.Ran{Status: 200, Keep: true, Answer: idem.Response{Status: 200}}
		}})
	}()
	ctx := receive(t, ctxs, "the handler did not run")
	receive(t, ticks.set, "no tick was set at the claim") // the first tick set, at the claim
	clock.Advance(third)
	ticks.Advance(tick)
	receive(t, ticks.set, "no next tick was set")
	// Exactly a third of the lease: the renewal is sent, and held.
	if end := receive(t, store.sent, "no renewal was sent at a third of the lease"); !end.Equal(clock.Now().Add(lease)) {
		t.Fatalf("the first renewal ends the lease at %v, want %v", end, clock.Now().Add(lease))
	}
	ticks.Advance(tick)
	receive(t, ticks.set, "no next tick was set")
	select {
	case end := <-store.sent:
		t.Fatalf("a renewal (to %v) sent while the first was on its way", end)
	default:
	}
	clock.Advance(third)
	close(store.release)
	select {
	case end := <-store.sent:
		if want := clock.Now().Add(lease); !end.Equal(want) {
			t.Fatalf("the renewal after the held one ends the lease at %v, want %v", end, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no renewal within 10s of the held one's return, the lease a third old from when it was sent; want one at once")
	}
	if ctx.Err() != nil {
		t.Fatalf("the handler was cancelled: %v", context.Cause(ctx))
	}
	close(done)
	if o := receive(t, out, "Serve did not return once the handler did"); o != keyed.OutcomeExecuted {
		t.Fatalf("outcome %v, want executed", o)
	}
}
