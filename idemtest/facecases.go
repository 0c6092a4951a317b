package idemtest

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

// faceLease is the lease of the suite's servers: the clock is the suite's,
// so its length costs no time. Its sixth, the heartbeat's tick, is whole
// milliseconds, as every store keeps them.
const faceLease = 12 * time.Second

// faceForm is how the engine runs a store's keys by default.
type faceForm struct {
	inTx, claimsInTx, points, holders bool
}

func formOf(store idem.Store) faceForm {
	var f faceForm
	_, f.inTx = store.(idem.TxStore)
	if _, ok := store.(idem.TxClaimer); ok && f.inTx {
		sw, serial := store.(idem.SerialWriter)
		f.claimsInTx = !serial || !sw.WritesSerially()
	}
	_, f.points = store.(idem.Recoverer)
	_, f.holders = store.(idem.Restarter)
	return f
}

// faceRun is one case's world: a store on a manual clock, and the servers
// of the face in front of it.
type faceRun struct {
	t      *testing.T
	face   Face
	clock  *idemmem.Clock
	timers *countedTimers
	store  idem.Store
	form   faceForm
}

func newFaceRun(t *testing.T, face Face, open func(t *testing.T, clock idem.Clock) idem.Store) *faceRun {
	clock := idemmem.NewClock(Start)
	store := open(t, clock)
	return &faceRun{t: t, face: face, clock: clock, timers: &countedTimers{clock: clock}, store: store, form: formOf(store)}
}

// serve starts a server of the face on the run's store with h, the
// suite's defaults, and what tweak changes of them.
func (r *faceRun) serve(h FaceHandler, tweak func(*FaceConfig)) Server {
	cfg := FaceConfig{Engine: keyed.Config{Store: r.store, Clock: r.clock, Timers: r.timers, Lease: faceLease, TTL: 24 * time.Hour,
		InflightWait: 5 * time.Second, PollInterval: 20 * time.Millisecond}, Handler: h}
	if tweak != nil {
		tweak(&cfg)
	}
	return r.face.Serve(r.t, cfg)
}

// record returns the key's record, as the store keeps it.
func (r *faceRun) record(key string) (idem.Record, error) {
	return r.store.Get(context.Background(), "", idem.Key(key))
}

// countedTimers are the clock's timers, counted, so that a case can tell
// that the engine's heartbeat has run its tick and set the next.
type countedTimers struct {
	clock *idemmem.Clock
	set   atomic.Int64
}

func (c *countedTimers) AfterFunc(d time.Duration, f func()) func() bool {
	defer c.set.Add(1)
	return c.clock.AfterFunc(d, f)
}

// Ways a case steps the clock.
const (
	stepClock   = iota // the clock alone: nothing holds a lease to renew
	stepTick           // and the heartbeat's tick
	stepRenewed        // and key's lease renewed when due
)

// step moves the clock by one heartbeat tick (a sixth of the lease); with
// stepTick it waits until the tick has run and set the next, and with
// stepRenewed, when key's lease is due for renewal (a third of it has
// passed since it began), until the store has it renewed from now: the
// clock does not move while a renewal is on its way.
func (r *faceRun) step(key string, mode int) {
	r.t.Helper()
	tick := faceLease / 6
	before := r.timers.set.Load()
	r.clock.Advance(tick)
	if mode == stepClock {
		return
	}
	Eventually(r.t, 20*time.Second, "the heartbeat's next tick", func() bool { return r.timers.set.Load() > before })
	if mode != stepRenewed {
		return
	}
	now := r.clock.Now()
	rec, err := r.record(key)
	if err != nil {
		r.t.Fatalf("the key's record: %v", err)
	}
	if now.Sub(rec.LeaseExpiresAt.Add(-faceLease)) < 2*tick {
		return // not due
	}
	Eventually(r.t, 20*time.Second, "the lease renewed", func() bool {
		rec, err := r.record(key)
		d := rec.LeaseExpiresAt.Sub(now.Add(faceLease))
		return err == nil && d > -time.Millisecond && d < time.Millisecond
	})
}

// gate is a handler's pause: the handler signals it entered, and waits
// until the case lets it go.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 64), release: make(chan struct{})} }

func (g *gate) wait() {
	g.entered <- struct{}{}
	<-g.release
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) awaitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30s")
	}
}

// claims is an Observer that counts claims begun.
type claims struct{ n atomic.Int64 }

func (c *claims) Begin(ctx context.Context, e keyed.Event) context.Context {
	if e.Phase == keyed.PhaseClaim {
		c.n.Add(1)
	}
	return ctx
}
func (*claims) End(context.Context, keyed.Event)                           {}
func (*claims) Store(context.Context, keyed.StoreOp, time.Duration, error) {}

func want(t *testing.T, what string, a Answer, kind Kind, body string, replayed bool) {
	t.Helper()
	if a.Kind != kind || (body != "" && a.Body != body) || a.Replayed != replayed {
		t.Fatalf("%s: %s; want %s %q (replayed %v)", what, a, kind, body, replayed)
	}
}

func wantCount(t *testing.T, s Server, o keyed.Outcome, n uint64) {
	t.Helper()
	if got := s.Counts()[o]; got != n {
		t.Fatalf("%d requests ended %s, want %d (counts %v)", got, o, n, s.Counts())
	}
}

func runFaceCases(t *testing.T, face Face, open func(t *testing.T, clock idem.Clock) idem.Store) {
	t.Helper()
	for _, c := range []struct {
		name string
		run  func(t *testing.T, r *faceRun)
	}{
		{"FirstRunReplayMismatch", fcFirstRun},
		{"DuplicatesWaitForTheFirst", fcDuplicatesWait},
		{"WaitEndsWithTheCaller", fcWaitEndsWithCaller},
		{"CallerLeavesHandlerGoesOn", fcCallerLeaves},
		{"TransientReleased", fcTransient},
		{"DeterministicKept", fcDeterministic},
		{"PanicKeepsNothing", fcPanic},
		{"PointNeverReleased", fcPointNeverReleased},
		{"CompleterFinishes", fcCompleter},
		{"PointSealedAtRest", fcPointSealed},
		{"LeaseLost", fcLeaseLost},
		{"AmbiguousCommit", fcAmbiguousCommit},
		{"LongHandlerRenewsItsLease", fcLongHandler},
		{"UnrenewedLeaseStopsHandler", fcRenewalFails},
		{"RestartTakesBackItsKeys", fcRestart},
		{"RetryAfterFromTheLease", fcRetryAfterFromLease},
		{"CompleterResumesInParallel", fcCompleterParallel},
		{"CompleterRenewsWhatItResumes", fcCompleterRenews},
		{"CompleterAnswerNotKeptIsUnknown", fcCompleterAnswerNotKept},
	} {
		t.Run(face.Name()+"/"+c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newFaceRun(t, face, open))
		})
	}
}

// counting is a handler that answers Created with the body and how many
// times it ran.
func counting(runs *atomic.Int64) FaceHandler {
	return func(ctx context.Context, body string) Reply {
		return Reply{Kind: Created, Body: fmt.Sprintf("%s#%d", body, runs.Add(1))}
	}
}

// A first request runs; its duplicate gets its answer replayed, from this
// server and from another one on the store; the key with another body is
// refused; the handler's context carries the Execution.
func fcFirstRun(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	h := func(ctx context.Context, body string) Reply {
		if ex, ok := keyed.ExecutionFromContext(ctx); !ok || ex.Key != "k" || ex.Token == 0 || ex.ClaimedAt.IsZero() {
			t.Errorf("the handler's Execution: %+v, %v", ex, ok)
		}
		return counting(&runs)(ctx, body)
	}
	s := r.serve(h, nil)
	ctx := t.Context()
	want(t, "first", s.Do(ctx, "k", "pay 10"), Created, "pay 10#1", false)
	want(t, "duplicate", s.Do(ctx, "k", "pay 10"), Created, "pay 10#1", true)
	want(t, "another request", s.Do(ctx, "k", "pay 99"), Mismatch, "", false)
	other := r.serve(h, nil) // another replica: nothing in its memory
	want(t, "duplicate on another server", other.Do(ctx, "k", "pay 10"), Created, "pay 10#1", true)
	want(t, "another request on another server", other.Do(ctx, "k", "pay 99"), Mismatch, "", false)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	wantCount(t, s, keyed.OutcomeExecuted, 1)
	wantCount(t, s, keyed.OutcomeReplayed, 1)
	wantCount(t, s, keyed.OutcomeMismatch, 1)
}

// Duplicates that arrive while the first runs wait for it and get its
// answer; the handler runs once.
func fcDuplicatesWait(t *testing.T, r *faceRun) {
	const n = 6
	var runs atomic.Int64
	g := newGate()
	obs := &claims{}
	s := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		return counting(&runs)(ctx, body)
	}, func(c *FaceConfig) { c.Engine.InflightWait = time.Minute; c.Engine.Observer = obs })
	answers := make(chan Answer, n+1)
	go func() { answers <- s.Do(t.Context(), "k", "pay") }()
	g.awaitEntered(t)
	for range n {
		go func() { answers <- s.Do(t.Context(), "k", "pay") }()
	}
	Eventually(t, 30*time.Second, "every duplicate claiming", func() bool { return obs.n.Load() >= n+1 })
	g.open()
	replays := 0
	for range n + 1 {
		a := <-answers
		if a.Kind != Created || a.Body != "pay#1" {
			t.Fatalf("an answer: %s", a)
		}
		if a.Replayed {
			replays++
		}
	}
	if runs.Load() != 1 || replays != n {
		t.Fatalf("%d runs, %d replays; want 1 and %d", runs.Load(), replays, n)
	}
}

// A duplicate's wait ends when its caller gives up (its deadline, or it
// leaves), not at InflightWait: it returns long before that, and the
// request is counted a conflict.
func fcWaitEndsWithCaller(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	g := newGate()
	s := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		return counting(&runs)(ctx, body)
	}, func(c *FaceConfig) { c.Engine.InflightWait = time.Hour })
	defer g.open()
	first := make(chan Answer, 1)
	go func() { first <- s.Do(t.Context(), "k", "pay") }()
	g.awaitEntered(t)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	a := s.Do(ctx, "k", "pay")
	if took := time.Since(start); took > 30*time.Second || (a.Kind != Gone && a.Kind != InFlight) {
		t.Fatalf("a duplicate whose caller gives up after 300ms: %s after %v; want it over then, not at InflightWait (1h)", a, took)
	}
	Eventually(t, 30*time.Second, "the duplicate counted a conflict", func() bool { return s.Counts()[keyed.OutcomeConflict] == 1 })
	g.open()
	want(t, "the first", <-first, Created, "pay#1", false)
}

// A caller that leaves while the handler runs does not end the handler's
// context: the handler finishes, its answer is kept, and the caller's
// retry gets it replayed rather than a second run.
func fcCallerLeaves(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	g := newGate()
	var handlerErr atomic.Value
	arrived := make(chan context.Context, 4)
	s := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		handlerErr.Store(fmt.Sprint(ctx.Err()))
		return counting(&runs)(ctx, body)
	}, func(c *FaceConfig) { c.Arrived = func(ctx context.Context) { arrived <- ctx } })
	defer g.open()
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan Answer, 1)
	go func() { first <- s.Do(ctx, "k", "pay") }()
	g.awaitEntered(t)
	reqCtx := <-arrived
	cancel()
	want(t, "the caller that left", <-first, Gone, "", false)
	select {
	case <-reqCtx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not see its caller leave within 30s")
	}
	g.open()
	Eventually(t, 30*time.Second, "the execution kept", func() bool { return s.Counts()[keyed.OutcomeExecuted] == 1 })
	if e := handlerErr.Load(); e != "<nil>" {
		t.Fatalf("the handler's context ended when its caller left: %v", e)
	}
	want(t, "the retry", s.Do(t.Context(), "k", "pay"), Created, "pay#1", true)
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
}

// A transient answer keeps nothing: the key is released and the retry
// runs again, and its answer is kept.
func fcTransient(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	s := r.serve(func(ctx context.Context, body string) Reply {
		if runs.Add(1) == 1 {
			return Reply{Kind: Transient, Body: "try later"}
		}
		return Reply{Kind: Created, Body: "paid"}
	}, nil)
	ctx := t.Context()
	want(t, "first", s.Do(ctx, "k", "pay"), Transient, "try later", false)
	want(t, "retry", s.Do(ctx, "k", "pay"), Created, "paid", false)
	want(t, "again", s.Do(ctx, "k", "pay"), Created, "paid", true)
	wantCount(t, s, keyed.OutcomeReleased, 1)
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2", runs.Load())
	}
}

// A deterministic refusal is kept and replayed.
func fcDeterministic(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	s := r.serve(func(ctx context.Context, body string) Reply {
		runs.Add(1)
		return Reply{Kind: Refused, Body: "insufficient funds"}
	}, nil)
	ctx := t.Context()
	want(t, "first", s.Do(ctx, "k", "pay"), Refused, "insufficient funds", false)
	want(t, "retry", s.Do(ctx, "k", "pay"), Refused, "insufficient funds", true)
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
}

// A handler that panics keeps nothing: the key is released, the retry runs.
func fcPanic(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	s := r.serve(func(ctx context.Context, body string) Reply {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		return Reply{Kind: Created, Body: "paid"}
	}, nil)
	ctx := t.Context()
	want(t, "first", s.Do(ctx, "k", "pay"), Failed, "", false)
	wantCount(t, s, keyed.OutcomeReleased, 1)
	want(t, "retry", s.Do(ctx, "k", "pay"), Created, "paid", false)
}

// A key with a recovery point is never released after a failure, in any
// form: an execution in the separate form saves a point and fails; the
// retry, in the store's own form (the same-transaction ones where it has
// them), goes on from the point and fails too; the key stays in flight
// with its point, its lease yielded, and the next retry takes it over at
// once and finishes it.
func fcPointNeverReleased(t *testing.T, r *faceRun) {
	if !r.form.points {
		t.Skipf("%T keeps no recovery points", r.store)
	}
	var runs atomic.Int64
	h := func(ctx context.Context, body string) Reply {
		n := runs.Add(1)
		ex, _ := keyed.ExecutionFromContext(ctx)
		switch {
		case n == 1:
			if err := keyed.SaveRecovery(ctx, "charging", []byte("10")); err != nil {
				t.Errorf("SaveRecovery: %v", err)
			}
		case ex.Recovery.Name != "charging":
			t.Errorf("run %d goes on from %q, want charging", n, ex.Recovery.Name)
		}
		if n < 3 {
			return Reply{Kind: Transient, Body: "card network down"}
		}
		return Reply{Kind: Created, Body: "charged"}
	}
	quick := func(c *FaceConfig) { c.Engine.InflightWait = -1 }
	separate := r.serve(h, func(c *FaceConfig) { quick(c); c.Engine.SeparateTx = true })
	own := r.serve(h, quick)
	ctx := t.Context()
	inFlightWithPoint := func(after string) {
		t.Helper()
		rec, err := r.record("k")
		if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
			t.Fatalf("after %s: %+v, %v; want the key in flight with its point, never released", after, rec, err)
		}
	}
	want(t, "the first, which saves a point", separate.Do(ctx, "k", "pay"), Transient, "card network down", false)
	inFlightWithPoint("the first failure")
	wantCount(t, separate, keyed.OutcomeUnfinished, 1)
	want(t, "the retry, in the store's form", own.Do(ctx, "k", "pay"), Transient, "card network down", false)
	inFlightWithPoint("the retry's failure")
	wantCount(t, own, keyed.OutcomeUnfinished, 1)
	wantCount(t, own, keyed.OutcomeReleased, 0)
	want(t, "the next retry", own.Do(ctx, "k", "pay"), Created, "charged", false)
	if runs.Load() != 3 {
		t.Fatalf("%d runs, want 3", runs.Load())
	}
}

// An execution that dies after its recovery point is finished by the
// Completer, with nobody asking: the client's retry gets its answer.
func fcCompleter(t *testing.T, r *faceRun) {
	if !r.form.points {
		t.Skipf("%T keeps no recovery points", r.store)
	}
	var runs atomic.Int64
	s := r.serve(func(ctx context.Context, body string) Reply {
		runs.Add(1)
		if err := keyed.SaveRecovery(ctx, "charging", []byte(body)); err != nil {
			t.Errorf("SaveRecovery: %v", err)
		}
		panic("the process died after the charge")
	}, func(c *FaceConfig) { c.Engine.SeparateTx = true; c.Engine.InflightWait = -1 })
	ctx := t.Context()
	s.Do(ctx, "k", "pay 10") // the face's words for a panic after a point differ
	wantCount(t, s, keyed.OutcomeUnfinished, 1)
	comp, err := s.NewCompleter(keyed.CompleterConfig{Every: time.Hour}, func(ctx context.Context, ex keyed.Execution) (Reply, error) {
		if ex.Recovery.Name != "charging" || string(ex.Recovery.Data) != "pay 10" {
			return Reply{}, fmt.Errorf("resumed from %+v", ex.Recovery)
		}
		return Reply{Kind: Created, Body: "finished by the completer"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := comp.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want the abandoned key finished", n, err)
	}
	want(t, "the client's retry", s.Do(ctx, "k", "pay 10"), Created, "finished by the completer", true)
	if runs.Load() != 1 || comp.Stats().Completed != 1 {
		t.Fatalf("%d runs, completer stats %+v; want 1 run and 1 completed", runs.Load(), comp.Stats())
	}
}

// A recovery point's data is kept sealed with the body keys, bound to its
// record: the store never returns it in clear. A server that lacks the key
// that sealed it runs nothing and keeps the key in flight with its point;
// one whose body keys were rotated (a new key first, the old one still
// given) reads it back as it was saved, and so does its Completer. Every
// execution derives the same downstream key.
func fcPointSealed(t *testing.T, r *faceRun) {
	if !r.form.points {
		t.Skipf("%T keeps no recovery points", r.store)
	}
	secret := []byte("a key secret of 32 bytes, random")
	old := keyed.BodyKey{ID: "2026-01", Key: []byte("0123456789abcdef0123456789abcdef")}
	rotated := keyed.BodyKey{ID: "2026-02", Key: []byte("fedcba9876543210fedcba9876543210")}
	const data = "charge card 4242 for the sealed point"
	var (
		runs atomic.Int64
		mu   sync.Mutex
		keys []string
	)
	downstream := func(ex keyed.Execution) {
		mu.Lock()
		keys = append(keys, ex.DownstreamKey("charge"))
		mu.Unlock()
	}
	h := func(ctx context.Context, body string) Reply {
		n := runs.Add(1)
		ex, _ := keyed.ExecutionFromContext(ctx)
		downstream(ex)
		if n == 1 {
			if err := keyed.SaveRecovery(ctx, "charging", []byte(data)); err != nil {
				t.Errorf("SaveRecovery: %v", err)
			}
		} else if ex.Recovery.Name != "charging" || string(ex.Recovery.Data) != data {
			t.Errorf("run %d goes on from %q %q, want charging %q", n, ex.Recovery.Name, ex.Recovery.Data, data)
		}
		return Reply{Kind: Transient, Body: "card network down"}
	}
	with := func(bodyKeys ...keyed.BodyKey) func(*FaceConfig) {
		return func(c *FaceConfig) {
			c.Engine.SeparateTx, c.Engine.InflightWait = true, -1
			c.Engine.KeySecret, c.Engine.BodyKeys = secret, bodyKeys
		}
	}
	ctx := t.Context()
	stored := func(after string) idem.Record {
		t.Helper()
		rec, err := r.store.Get(ctx, "", keyed.SealKey(secret, "", "k"))
		if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
			t.Fatalf("after %s: %+v, %v; want the key in flight with its point", after, rec, err)
		}
		if len(rec.Recovery.Data) == 0 || strings.Contains(string(rec.Recovery.Data), "4242") {
			t.Fatalf("after %s the store keeps the point's data as %q, in clear", after, rec.Recovery.Data)
		}
		return rec
	}
	want(t, "the first, which saves a point", r.serve(h, with(old)).Do(ctx, "k", "pay"), Transient, "card network down", false)
	stored("the first run")

	a := r.serve(h, with(rotated)).Do(ctx, "k", "pay")
	if a.Kind != Unreadable || runs.Load() != 1 {
		t.Fatalf("a server without the point's body key answered %v after %d runs; want nothing run", a, runs.Load())
	}
	stored("the server without its body key")

	s := r.serve(h, with(rotated, old))
	want(t, "the retry after the rotation", s.Do(ctx, "k", "pay"), Transient, "card network down", false)
	stored("the retry")
	comp, err := s.NewCompleter(keyed.CompleterConfig{Every: time.Hour}, func(ctx context.Context, ex keyed.Execution) (Reply, error) {
		downstream(ex)
		if ex.Recovery.Name != "charging" || string(ex.Recovery.Data) != data {
			return Reply{}, fmt.Errorf("resumed from %q %q", ex.Recovery.Name, ex.Recovery.Data)
		}
		return Reply{Kind: Created, Body: "charged"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := comp.RunOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RunOnce = %d, %v; want the key finished", n, err)
	}
	want(t, "the client's next retry", s.Do(ctx, "k", "pay"), Created, "charged", true)
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("downstream keys %q; want the same three times", keys)
	}
}

// An execution that outlives its lease unrenewed is taken over; its late
// completion is refused (fencing), and its effect, in the same-transaction
// forms, rolled back. (In the ClaimTx form no other transaction can take
// the key while the claim's runs: there is nothing to lose.)
func fcLeaseLost(t *testing.T, r *faceRun) {
	if r.form.claimsInTx {
		t.Skip("in the ClaimTx form nothing can take a key over while its claim's transaction runs")
	}
	g := newGate()
	a := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		return Reply{Kind: Created, Body: "late"}
	}, nil)
	defer g.open()
	b := r.serve(func(ctx context.Context, body string) Reply {
		return Reply{Kind: Created, Body: "took over"}
	}, func(c *FaceConfig) { c.Engine.InflightWait = -1 })
	first := make(chan Answer, 1)
	go func() { first <- a.Do(t.Context(), "k", "pay") }()
	g.awaitEntered(t)
	// Its lease ends, unrenewed (its process stalled, say).
	r.clock.Advance(faceLease + time.Second)
	want(t, "the retry after the lease", b.Do(t.Context(), "k", "pay"), Created, "took over", false)
	g.open()
	late := <-first
	Eventually(t, 30*time.Second, "the late completion refused", func() bool { return a.Counts()[keyed.OutcomeLeaseLost] == 1 })
	if r.form.inTx {
		want(t, "the late execution, rolled back", late, LeaseLost, "", false)
	} else {
		want(t, "the late execution, its effect done", late, Created, "late", false)
	}
	want(t, "a third try", b.Do(t.Context(), "k", "pay"), Created, "took over", true)
}

// ambiguousStore is a TxStore whose CompleteTx reports a failure of the
// commit: after it committed (fail after), or having done nothing (fail
// before). It offers only the TxStore face, so the engine runs the
// CompleteTx form.
type ambiguousStore struct {
	idem.TxStore
	after bool
}

var errConnReset = errors.New("connection reset by peer")

func (s ambiguousStore) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	if !s.after {
		return false, errConnReset
	}
	kept, err := s.TxStore.CompleteTx(ctx, ref, work)
	if err == nil && kept {
		return false, errConnReset
	}
	return kept, err
}

// A commit whose outcome is unknown: the engine asks the store. Committed,
// the execution counts and its answer is sent; not committed, the key is
// released, the client told to retry, and the retry runs.
func fcAmbiguousCommit(t *testing.T, r *faceRun) {
	ts, ok := r.store.(idem.TxStore)
	if !ok {
		t.Skipf("%T has no transaction whose commit could fail", r.store)
	}
	var runs atomic.Int64
	h := counting(&runs)
	committed := r.serve(h, func(c *FaceConfig) { c.Engine.Store = ambiguousStore{TxStore: ts, after: true} })
	want(t, "a commit that failed after committing", committed.Do(t.Context(), "k1", "pay"), Created, "pay#1", false)
	wantCount(t, committed, keyed.OutcomeExecuted, 1)
	want(t, "its retry", committed.Do(t.Context(), "k1", "pay"), Created, "pay#1", true)

	lost := r.serve(h, func(c *FaceConfig) { c.Engine.Store = ambiguousStore{TxStore: ts} })
	want(t, "a commit that failed", lost.Do(t.Context(), "k2", "pay"), Unavailable, "", false)
	wantCount(t, lost, keyed.OutcomeStoreError, 1)
	if _, err := r.record("k2"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the key of a commit that failed: %v; want it released", err)
	}
	want(t, "its retry", r.serve(h, nil).Do(t.Context(), "k2", "pay"), Created, "pay#2", false)
}

// A handler that runs three times its lease keeps its key while it runs:
// its lease is renewed, a duplicate meanwhile is told the key is in flight
// (and to retry when the lease ends), never run; the handler's answer is
// kept.
func fcLongHandler(t *testing.T, r *faceRun) {
	var runs atomic.Int64
	g := newGate()
	s := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		if err := ctx.Err(); err != nil {
			t.Errorf("the handler's context ended while it ran: %v (%v)", err, context.Cause(ctx))
		}
		return counting(&runs)(ctx, body)
	}, nil)
	defer g.open()
	dup := r.serve(counting(&runs), func(c *FaceConfig) { c.Engine.InflightWait = -1 })
	first := make(chan Answer, 1)
	go func() { first <- s.Do(t.Context(), "k", "pay") }()
	g.awaitEntered(t)
	mode := stepRenewed
	if r.form.claimsInTx {
		mode = stepClock // a ClaimTx's key is invisible until it commits: nothing to renew
	}
	for i := range 3 * 6 {
		r.step("k", mode)
		if i == 9 {
			a := dup.Do(t.Context(), "k", "pay")
			if a.Kind != InFlight || a.RetryAfter <= 0 || a.RetryAfter > faceLease {
				t.Fatalf("a duplicate after 1.5 leases: %s; want in flight, retry within the lease", a)
			}
		}
	}
	g.open()
	want(t, "the long execution", <-first, Created, "pay#1", false)
	want(t, "a duplicate after it", dup.Do(t.Context(), "k", "pay"), Created, "pay#1", true)
	wantCount(t, s, keyed.OutcomeExecuted, 1)
}

// renewRefused is a store whose renewals fail (the store unreachable, for
// them), the rest working. It offers only the Store face.
type renewRefused struct{ idem.Store }

func (renewRefused) Renew(context.Context, idem.Ref, time.Duration) (time.Time, error) {
	return time.Time{}, errors.New("dial tcp: connection refused")
}

// A handler whose lease cannot be renewed has its context cancelled
// before the lease ends, with a cause that wraps idem.ErrLeaseLost: it
// stops before another may take the key over.
func fcRenewalFails(t *testing.T, r *faceRun) {
	var cause atomic.Value
	entered := make(chan context.Context, 1)
	done := make(chan struct{})
	s := r.serve(func(ctx context.Context, body string) Reply {
		defer close(done)
		entered <- ctx
		select {
		case <-ctx.Done():
			cause.Store(context.Cause(ctx))
		case <-time.After(time.Minute):
		}
		return Reply{Kind: Transient, Body: "stopped"}
	}, func(c *FaceConfig) { c.Engine.Store = renewRefused{r.store} })
	answer := make(chan Answer, 1)
	claimed := r.clock.Now()
	go func() { answer <- s.Do(t.Context(), "k", "pay") }()
	var hctx context.Context
	select {
	case hctx = <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start")
	}
	// The heartbeat's tick that gives the lease up cancels the handler's
	// context before it sets the next tick, which each step waits for: so
	// the handler's context says, right after each step, whether that
	// step's clock stopped it. (Reading the clock where the handler sees
	// its context end instead would race with the next step.)
	var stoppedAt time.Time
	for i := 0; i < 6 && stoppedAt.IsZero(); i++ {
		r.step("k", stepTick)
		if hctx.Err() != nil {
			stoppedAt = r.clock.Now()
		}
	}
	if stoppedAt.IsZero() {
		t.Fatalf("the handler's context still alive at %v, its lease ending at %v", r.clock.Now(), claimed.Add(faceLease))
	}
	<-done
	c, _ := cause.Load().(error)
	if !errors.Is(c, idem.ErrLeaseLost) {
		t.Fatalf("the handler's context ended with cause %v; want one that wraps idem.ErrLeaseLost", c)
	}
	if !stoppedAt.Before(claimed.Add(faceLease)) {
		t.Fatalf("the handler was stopped at %v, its lease ending at %v: too late", stoppedAt, claimed.Add(faceLease))
	}
	<-answer
}

// A replica that restarts ends at once the leases its earlier incarnation
// held: the retry of a key that incarnation held runs at once. Another
// replica's restart touches none of them.
func fcRestart(t *testing.T, r *faceRun) {
	if !r.form.holders {
		t.Skipf("%T keeps no holders", r.store)
	}
	g := newGate()
	defer g.open()
	holder := func(replica, inc string) func(*FaceConfig) {
		return func(c *FaceConfig) {
			c.Engine.Holder = idem.Holder{Replica: replica, Incarnation: inc}
			c.Engine.InflightWait = -1
			// The dying incarnation holds its key outside a ClaimTx, whose
			// transaction a dead process's database connection ends.
			c.Engine.SeparateTx = inc == "1"
		}
	}
	dead := r.serve(func(ctx context.Context, body string) Reply {
		g.wait()
		return Reply{Kind: Created, Body: "never"}
	}, holder("a", "1"))
	go dead.Do(t.Context(), "k", "pay") // its process is as good as dead
	g.awaitEntered(t)
	var runs atomic.Int64
	other := r.serve(counting(&runs), holder("b", "1"))
	if n, err := other.Restart(t.Context()); n != 0 || err != nil {
		t.Fatalf("another replica's Restart = %d, %v; want nothing ended", n, err)
	}
	if a := other.Do(t.Context(), "k", "pay"); a.Kind != InFlight {
		t.Fatalf("the key after another replica's restart: %s; want still in flight", a)
	}
	again := r.serve(counting(&runs), holder("a", "2"))
	if n, err := again.Restart(t.Context()); n != 1 || err != nil {
		t.Fatalf("the replica's Restart = %d, %v; want its earlier incarnation's lease ended", n, err)
	}
	want(t, "the retry after the restart", again.Do(t.Context(), "k", "pay"), Created, "pay#1", false)
}
