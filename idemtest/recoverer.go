package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TestRecoverer runs, as subtests of t, the contract of idem.Recoverer: the
// recovery points with which an execution says how far it got.
//
//   - A point saved under the holder's token is read back by Get and
//     survives a crash (the lease ending) and a takeover, whose Claim
//     carries it to the next execution; saving again replaces it.
//   - It is refused (ErrLeaseLost) under a token that no longer holds the
//     key, and for a key completed or absent; a malformed point is refused
//     with an *idem.ArgumentError. Neither changes the record.
//   - A key claimed anew (expired and not held) starts with no point.
//   - A key in flight with a point outlives its TTL: Get returns it, a Claim
//     takes it over, Purge keeps it.
//   - Yield ends the holder's lease at once and keeps the rest: the key is
//     in flight with its point, listed by Abandoned, and taken over by the
//     next Claim at once, under a greater token even when no time has
//     passed since the yielded claim; a stale token's Yield is refused.
//   - Release refuses a key in flight with a point (ErrHasRecoveryPoint),
//     changing nothing; ReleaseWithPoint releases it, under its holder's
//     token only, and succeeds again once it is gone.
//   - Abandoned lists exactly the keys in flight, with a point, whose lease
//     ended, oldest lease end first, at most limit of them.
//   - A store with InFlightAtPoints (idemsqlite's, idempg's, idempgsql's;
//     the subtest skips for one without) lists every key in flight with a point,
//     whether its holder's lease ended (as Abandoned lists it) or not,
//     oldest lease end first, at most limit of them; a key without a point
//     and one completed are not listed, and a limit below 1 is refused
//     with an *idem.ArgumentError.
//   - With a database (db not nil): a point saved in the transaction of a
//     phase commits with the phase's writes, and rolls back with them.
//
// newStore is called once per subtest and returns a fresh store reading
// the time from clock and, when its database has transactions, the
// database's transaction helper (TxRunner, as TestWithTx takes it) and a
// view of its effects (InboxEffects); both nil for a store without
// transactions (idemmem), whose phase subtests then skip.
func TestRecoverer(t *testing.T, newStore func(t *testing.T, clock idem.Clock) (idem.Recoverer, TxRunner, InboxEffects)) {
	t.Helper()
	for _, tc := range recovererTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(Start)
			s, db, fx := newStore(t, clock)
			if s == nil {
				t.Fatal("newStore returned a nil store")
			}
			if tc.needsTx && (db == nil || fx == nil) {
				t.Skip("the store has no transactions of its own")
			}
			tc.run(t, &recEnv{env: &env{t: t, ctx: t.Context(), clock: clock, store: s}, rec: s, db: db, fx: fx})
		})
	}
}

var recovererTests = []struct {
	name    string
	needsTx bool
	run     func(t *testing.T, e *recEnv)
}{
	{"SavedAndRead", false, testRecoverySaved},
	{"SurvivesTakeover", false, testRecoveryTakeover},
	{"Replaced", false, testRecoveryReplaced},
	{"RefusedWithoutLease", false, testRecoveryRefused},
	{"InvalidPoint", false, testRecoveryInvalid},
	{"ClaimAnewStartsEmpty", false, testRecoveryClaimAnew},
	{"OutlivesTTL", false, testRecoveryOutlivesTTL},
	{"Yield", false, testRecoveryYield},
	{"TakeoverAtTheInstantOfTheClaim", false, testRecoveryTakeoverSameInstant},
	{"ReleaseRefusedWithPoint", false, testRecoveryRelease},
	{"Abandoned", false, testRecoveryAbandoned},
	{"AbandonedLimit", false, testRecoveryAbandonedLimit},
	{"InFlightAtPoints", false, testRecoveryInFlightAtPoints},
	{"CommitsWithPhase", true, testRecoveryCommits},
	{"RollsBackWithPhase", true, testRecoveryRollsBack},
}

type recEnv struct {
	*env
	rec idem.Recoverer
	db  TxRunner
	fx  InboxEffects
}

func (e *recEnv) acquire(key string) idem.Claim {
	e.t.Helper()
	c, err := e.rec.Claim(e.ctx, e.req(key, "fp"))
	if err != nil || c.Outcome != idem.Acquired {
		e.t.Fatalf("Claim(%s) = %v, %v; want acquired", key, c.Outcome, err)
	}
	return c
}

func keyRef(key string, c idem.Claim) idem.Ref {
	return idem.Ref{Scope: "s", Key: idem.Key(key), Token: c.Token}
}

func (e *recEnv) save(r idem.Ref, name, data string) {
	e.t.Helper()
	if err := e.rec.SaveRecovery(e.ctx, r, idem.RecoveryPoint{Name: name, Data: []byte(data)}); err != nil {
		e.t.Fatalf("SaveRecovery(%s, %q) = %v", r.Key, name, err)
	}
}

// point returns the key's recovery point as Get reads it.
func (e *recEnv) point(key string) idem.RecoveryPoint {
	e.t.Helper()
	rec, err := e.rec.Get(e.ctx, "s", idem.Key(key))
	if err != nil {
		e.t.Fatalf("Get(%s) = %v", key, err)
	}
	return rec.Recovery
}

func samePoint(got idem.RecoveryPoint, name, data string, saved time.Time) error {
	if got.Name != name || !bytes.Equal(got.Data, []byte(data)) || !got.SavedAt.Equal(saved) {
		return fmt.Errorf("recovery point = {%q %q saved %v}; want {%q %q saved %v}",
			got.Name, got.Data, got.SavedAt, name, data, saved)
	}
	return nil
}

func testRecoverySaved(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	if !c.Record.Recovery.IsZero() {
		t.Fatalf("a new key's claim carries recovery point %+v", c.Record.Recovery)
	}
	e.clock.Advance(time.Millisecond)
	at := e.clock.Now()
	e.save(keyRef("k", c), "charging", "ch_1")
	if err := samePoint(e.point("k"), "charging", "ch_1", at); err != nil {
		t.Fatal(err)
	}
	// Completing keeps the point, as history; the answer is the record's.
	if err := e.rec.Complete(e.ctx, keyRef("k", c), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	rec, err := e.rec.Get(e.ctx, "s", "k")
	if err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("Get after Complete = %v, %v", rec.State, err)
	}
	if err := samePoint(rec.Recovery, "charging", "ch_1", at); err != nil {
		t.Fatalf("after Complete: %v", err)
	}
}

func testRecoveryTakeover(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	at := e.clock.Now()
	e.save(keyRef("k", c), "charging", "params")
	// The holder dies: its lease ends, and the next execution takes over.
	e.clock.Advance(lease + time.Millisecond)
	c2, err := e.rec.Claim(e.ctx, e.req("k", "fp"))
	if err != nil || c2.Outcome != idem.Acquired || !c2.TookOver {
		t.Fatalf("Claim after the lease = %v (took over %v), %v; want a takeover", c2.Outcome, c2.TookOver, err)
	}
	if err := samePoint(c2.Record.Recovery, "charging", "params", at); err != nil {
		t.Fatalf("the takeover's Claim: %v", err)
	}
	if err := samePoint(e.point("k"), "charging", "params", at); err != nil {
		t.Fatalf("Get after the takeover: %v", err)
	}
	// The new holder goes on from there.
	e.save(keyRef("k", c2), "recorded", "pay_1")
	if err := samePoint(e.point("k"), "recorded", "pay_1", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
}

func testRecoveryReplaced(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "one", "a much longer first payload")
	e.clock.Advance(time.Millisecond)
	e.save(keyRef("k", c), "two", "")
	if err := samePoint(e.point("k"), "two", "", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
}

func testRecoveryRefused(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "first")
	at := e.clock.Now()
	e.clock.Advance(lease + time.Millisecond)
	c2, err := e.rec.Claim(e.ctx, e.req("k", "fp"))
	if err != nil || c2.Outcome != idem.Acquired {
		t.Fatalf("takeover = %v, %v", c2.Outcome, err)
	}
	// The holder whose lease was taken over cannot move the key on.
	err = e.rec.SaveRecovery(e.ctx, keyRef("k", c), idem.RecoveryPoint{Name: "recorded", Data: []byte("stale")})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("SaveRecovery by the stale holder = %v; want ErrLeaseLost", err)
	}
	if err := samePoint(e.point("k"), "charging", "first", at); err != nil {
		t.Fatalf("after the stale holder's refusal: %v", err)
	}
	// Nor can anyone save on a completed key, nor on an absent one.
	if err := e.rec.Complete(e.ctx, keyRef("k", c2), idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	err = e.rec.SaveRecovery(e.ctx, keyRef("k", c2), idem.RecoveryPoint{Name: "after"})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("SaveRecovery on a completed key = %v; want ErrLeaseLost", err)
	}
	if err := samePoint(e.point("k"), "charging", "first", at); err != nil {
		t.Fatalf("after the refusal on a completed key: %v", err)
	}
	err = e.rec.SaveRecovery(e.ctx, idem.Ref{Scope: "s", Key: "absent", Token: c2.Token}, idem.RecoveryPoint{Name: "x"})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("SaveRecovery on an absent key = %v; want ErrLeaseLost", err)
	}
	if _, err := e.rec.Get(e.ctx, "s", "absent"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the refused SaveRecovery made a record: Get = %v", err)
	}
	// A released key is gone, its point with it.
	c3 := e.acquire("r")
	e.save(keyRef("r", c3), "charging", "")
	if err := e.rec.ReleaseWithPoint(e.ctx, keyRef("r", c3)); err != nil {
		t.Fatal(err)
	}
	if err := e.rec.SaveRecovery(e.ctx, keyRef("r", c3), idem.RecoveryPoint{Name: "x"}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("SaveRecovery on a released key = %v; want ErrLeaseLost", err)
	}
}

func testRecoveryInvalid(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "kept")
	at := e.clock.Now()
	e.clock.Advance(time.Millisecond)
	for _, rp := range []idem.RecoveryPoint{
		{},
		{Name: string(bytes.Repeat([]byte("n"), idem.MaxRecoveryNameLen+1))},
		{Name: "bad\x00name"},
		{Name: "\xff"},
		{Name: "big", Data: make([]byte, idem.MaxRecoveryDataLen+1)},
	} {
		err := e.rec.SaveRecovery(e.ctx, keyRef("k", c), rp)
		if !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("SaveRecovery(name %.20q, %d bytes) = %v; want an *idem.ArgumentError", rp.Name, len(rp.Data), err)
		}
	}
	if err := samePoint(e.point("k"), "charging", "kept", at); err != nil {
		t.Fatalf("after refused points: %v", err)
	}
}

func testRecoveryClaimAnew(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "old")
	if err := e.rec.Complete(e.ctx, keyRef("k", c), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(ttl + time.Millisecond)
	c2, err := e.rec.Claim(e.ctx, e.req("k", "another request"))
	if err != nil || c2.Outcome != idem.Acquired || c2.TookOver {
		t.Fatalf("Claim after the TTL = %v (took over %v), %v; want the key claimed anew", c2.Outcome, c2.TookOver, err)
	}
	if !c2.Record.Recovery.IsZero() {
		t.Fatalf("a key claimed anew carries the earlier generation's point %+v", c2.Record.Recovery)
	}
	if p := e.point("k"); !p.IsZero() {
		t.Fatalf("Get of a key claimed anew shows the earlier generation's point %+v", p)
	}
}

func testRecoveryOutlivesTTL(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	at := e.clock.Now()
	e.save(keyRef("k", c), "charging", "params")
	// Also a key with no point, which expires as before.
	e.acquire("plain")
	e.clock.Advance(ttl + lease + time.Second)
	if n, err := e.rec.Purge(e.ctx, 100); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1 (the key without a point)", n, err)
	}
	rec, err := e.rec.Get(e.ctx, "s", "k")
	if err != nil {
		t.Fatalf("Get of a key in flight with a point, past its TTL = %v; it must stay", err)
	}
	if rec.State != idem.StateInFlight {
		t.Fatalf("state = %v; want in flight", rec.State)
	}
	if err := samePoint(rec.Recovery, "charging", "params", at); err != nil {
		t.Fatal(err)
	}
	if c, err := e.rec.Claim(e.ctx, e.req("k", "another request")); err != nil || c.Outcome != idem.Mismatch {
		t.Fatalf("Claim with another fingerprint = %v, %v; want mismatch (the key is not claimed anew)", c.Outcome, err)
	}
	c2, err := e.rec.Claim(e.ctx, e.req("k", "fp"))
	if err != nil || c2.Outcome != idem.Acquired || !c2.TookOver {
		t.Fatalf("Claim = %v (took over %v), %v; want a takeover", c2.Outcome, c2.TookOver, err)
	}
	if err := samePoint(c2.Record.Recovery, "charging", "params", at); err != nil {
		t.Fatalf("the takeover's Claim: %v", err)
	}
	// Once completed, it expires by its TTL as every record does.
	if err := e.rec.Complete(e.ctx, keyRef("k", c2), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
}

func testRecoveryAbandoned(t *testing.T, e *recEnv) {
	if got, err := e.rec.Abandoned(e.ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("Abandoned of an empty store = %v, %v", got, err)
	}
	// first: in flight with a point; its holder dies first.
	first := e.acquire("first")
	e.save(keyRef("first", first), "charging", "1")
	e.clock.Advance(time.Second)
	// second: the same, a second later.
	second := e.acquire("second")
	e.save(keyRef("second", second), "charging", "2")
	// noPoint: in flight, dead, no point: nothing says how to go on.
	e.acquire("no point")
	// done: completed with a point.
	done := e.acquire("done")
	e.save(keyRef("done", done), "charging", "d")
	if err := e.rec.Complete(e.ctx, keyRef("done", done), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	// released: gone.
	rel := e.acquire("released")
	e.save(keyRef("released", rel), "charging", "r")
	if err := e.rec.ReleaseWithPoint(e.ctx, keyRef("released", rel)); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(lease - time.Second + time.Millisecond)
	// live: in flight with a point, its lease still running.
	live := e.acquire("live")
	e.save(keyRef("live", live), "charging", "l")

	got, err := e.rec.Abandoned(e.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := abandonedKeys(got, "first"); err != nil {
		t.Fatalf("with only first's lease ended: %v", err)
	}
	if err := samePoint(got[0].Recovery, "charging", "1", Start); err != nil {
		t.Fatalf("Abandoned's record: %v", err)
	}
	if got[0].State != idem.StateInFlight || got[0].Fingerprint != "fp" {
		t.Fatalf("Abandoned's record = state %v fingerprint %q; want in flight, fp", got[0].State, got[0].Fingerprint)
	}
	e.clock.Advance(time.Second)
	got, err = e.rec.Abandoned(e.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := abandonedKeys(got, "first", "second"); err != nil {
		t.Fatal(err)
	}
	// A takeover makes a key live again.
	if c, err := e.rec.Claim(e.ctx, e.req("first", "fp")); err != nil || !c.TookOver {
		t.Fatalf("takeover of first = %v, %v", c.Outcome, err)
	}
	got, err = e.rec.Abandoned(e.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := abandonedKeys(got, "second"); err != nil {
		t.Fatalf("after first was taken over: %v", err)
	}
}

func testRecoveryAbandonedLimit(t *testing.T, e *recEnv) {
	for i := range 5 {
		c := e.acquire(fmt.Sprint("k", i))
		e.save(keyRef(fmt.Sprint("k", i), c), "charging", "")
		e.clock.Advance(time.Millisecond)
	}
	e.clock.Advance(lease)
	got, err := e.rec.Abandoned(e.ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := abandonedKeys(got, "k0", "k1"); err != nil {
		t.Fatalf("Abandoned(2): %v", err)
	}
	if _, err := e.rec.Abandoned(e.ctx, 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("Abandoned(0) = %v; want an *idem.ArgumentError", err)
	}
}

func abandonedKeys(got []idem.Record, want ...string) error {
	var keys []string
	for _, r := range got {
		keys = append(keys, string(r.Key))
	}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		return fmt.Errorf("Abandoned listed %q; want %q", keys, want)
	}
	return nil
}

// inFlightAtPoints is what a store that lists its keys in flight at
// recovery points (idemsqlite's, idempg's, idempgsql's) adds to
// idem.Recoverer.
type inFlightAtPoints interface {
	InFlightAtPoints(ctx context.Context, limit int) ([]idem.Record, error)
}

func testRecoveryInFlightAtPoints(t *testing.T, e *recEnv) {
	s, ok := e.rec.(inFlightAtPoints)
	if !ok {
		t.Skip("the store does not list its keys in flight at points (InFlightAtPoints)")
	}
	gone := e.acquire("gone")
	e.save(keyRef("gone", gone), "charging", "{}")
	if err := e.rec.Yield(e.ctx, keyRef("gone", gone)); err != nil { // its holder's lease ended
		t.Fatal(err)
	}
	held := e.acquire("held") // its holder lives
	e.save(keyRef("held", held), "charging", "{}")
	e.acquire("plain")
	done := e.acquire("done")
	e.save(keyRef("done", done), "charging", "{}")
	e.complete(keyRef("done", done), idem.Response{Status: 201})
	listed := func(limit int, want ...string) {
		t.Helper()
		got, err := s.InFlightAtPoints(e.ctx, limit)
		if err != nil {
			t.Fatalf("InFlightAtPoints(%d): %v", limit, err)
		}
		var keys []string
		for _, r := range got {
			if r.State != idem.StateInFlight || r.Recovery.Name != "charging" {
				t.Fatalf("InFlightAtPoints(%d) listed %s: %s at %q; want in flight at charging", limit, r.Key, r.State, r.Recovery.Name)
			}
			keys = append(keys, string(r.Key))
		}
		if fmt.Sprint(keys) != fmt.Sprint(want) {
			t.Fatalf("InFlightAtPoints(%d) listed %q; want %q, the oldest lease end first", limit, keys, want)
		}
	}
	listed(10, "gone", "held")
	listed(1, "gone")
	if got, err := e.rec.Abandoned(e.ctx, 10); err != nil {
		t.Fatal(err)
	} else if err := abandonedKeys(got, "gone"); err != nil {
		t.Fatalf("beside InFlightAtPoints: %v", err)
	}
	if _, err := s.InFlightAtPoints(e.ctx, 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("InFlightAtPoints(0) = %v; want an *idem.ArgumentError", err)
	}
}

func testRecoveryCommits(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	err := e.db.WithTx(e.ctx, func(ctx context.Context) error {
		if err := e.fx.Write(ctx, "charge recorded"); err != nil {
			return err
		}
		return e.rec.SaveRecovery(ctx, keyRef("k", c), idem.RecoveryPoint{Name: "recorded", Data: []byte("pay_1")})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.fx.Count(e.ctx, "charge recorded"); err != nil || n != 1 {
		t.Fatalf("the phase's write: count %d, %v; want 1", n, err)
	}
	if err := samePoint(e.point("k"), "recorded", "pay_1", e.clock.Now()); err != nil {
		t.Fatal(err)
	}
}

func testRecoveryRollsBack(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "params")
	at := e.clock.Now()
	e.clock.Advance(time.Millisecond)
	failed := errors.New("the phase failed after saving its point")
	err := e.db.WithTx(e.ctx, func(ctx context.Context) error {
		if err := e.fx.Write(ctx, "charge recorded"); err != nil {
			return err
		}
		if err := e.rec.SaveRecovery(ctx, keyRef("k", c), idem.RecoveryPoint{Name: "recorded", Data: []byte("pay_1")}); err != nil {
			return err
		}
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("WithTx = %v; want the phase's error", err)
	}
	if n, err := e.fx.Count(e.ctx, "charge recorded"); err != nil || n != 0 {
		t.Fatalf("the rolled-back phase's write: count %d, %v; want 0", n, err)
	}
	if err := samePoint(e.point("k"), "charging", "params", at); err != nil {
		t.Fatalf("the point saved in a rolled-back phase stayed: %v", err)
	}
}

// A holder that yields at the instant it claimed (the clock has not moved)
// is taken over at once, and the takeover's token must still be greater
// than its own: a token read off the clock alone would be the same, and
// the holder fenced out could then still complete the key.
func testRecoveryTakeoverSameInstant(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "params")
	if err := e.rec.Yield(e.ctx, keyRef("k", c)); err != nil {
		t.Fatalf("Yield = %v", err)
	}
	c2, err := e.rec.Claim(e.ctx, e.req("k", "fp"))
	if err != nil || c2.Outcome != idem.Acquired || !c2.TookOver {
		t.Fatalf("Claim after Yield = %v (took over %v), %v; want a takeover at once", c2.Outcome, c2.TookOver, err)
	}
	if c2.Token <= c.Token {
		t.Fatalf("the takeover's token %d; want one greater than the yielded holder's %d", c2.Token, c.Token)
	}
	if err := e.rec.Complete(e.ctx, keyRef("k", c), idem.Response{Status: 201}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Complete by the yielded holder = %v; want ErrLeaseLost", err)
	}
	if err := e.rec.Complete(e.ctx, keyRef("k", c2), idem.Response{Status: 202}); err != nil {
		t.Fatalf("Complete by the new holder = %v", err)
	}
	if rec, err := e.rec.Get(e.ctx, "s", "k"); err != nil || rec.State != idem.StateCompleted || rec.Response.Status != 202 {
		t.Fatalf("the key after both completions: %+v, %v; want completed with the new holder's 202", rec, err)
	}
}

func testRecoveryYield(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "params")
	at := e.clock.Now()
	e.clock.Advance(time.Millisecond)
	if err := e.rec.Yield(e.ctx, keyRef("k", c)); err != nil {
		t.Fatalf("Yield = %v", err)
	}
	rec, err := e.rec.Get(e.ctx, "s", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Token != c.Token || rec.LeaseExpiresAt.After(e.clock.Now()) {
		t.Fatalf("after Yield: %+v, %v; want in flight under the same token, its lease ended", rec, err)
	}
	if err := samePoint(rec.Recovery, "charging", "params", at); err != nil {
		t.Fatalf("after Yield: %v", err)
	}
	got, err := e.rec.Abandoned(e.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := abandonedKeys(got, "k"); err != nil {
		t.Fatalf("right after Yield: %v", err)
	}
	// The next claim takes it over at once, the point with it.
	c2, err := e.rec.Claim(e.ctx, e.req("k", "fp"))
	if err != nil || c2.Outcome != idem.Acquired || !c2.TookOver {
		t.Fatalf("Claim after Yield = %v (took over %v), %v; want a takeover at once", c2.Outcome, c2.TookOver, err)
	}
	if err := samePoint(c2.Record.Recovery, "charging", "params", at); err != nil {
		t.Fatalf("the takeover after Yield: %v", err)
	}
	// The stale holder cannot yield the new one's lease.
	if err := e.rec.Yield(e.ctx, keyRef("k", c)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Yield by the stale holder = %v; want ErrLeaseLost", err)
	}
	if got, _ := e.rec.Abandoned(e.ctx, 10); len(got) != 0 {
		t.Fatalf("the stale holder's refused Yield ended the new lease: Abandoned = %v", got)
	}
	if err := e.rec.Complete(e.ctx, keyRef("k", c2), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := e.rec.Yield(e.ctx, keyRef("k", c2)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Yield of a completed key = %v; want ErrLeaseLost", err)
	}
	if err := e.rec.Yield(e.ctx, idem.Ref{Scope: "s", Key: "absent", Token: c2.Token}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Yield of an absent key = %v; want ErrLeaseLost", err)
	}
}

func testRecoveryRelease(t *testing.T, e *recEnv) {
	c := e.acquire("k")
	e.save(keyRef("k", c), "charging", "params")
	at := e.clock.Now()
	before, err := e.rec.Get(e.ctx, "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	// Whoever asks, a key whose phases may have acted outside stays.
	if err := e.rec.Release(e.ctx, keyRef("k", c)); !errors.Is(err, idem.ErrHasRecoveryPoint) {
		t.Fatalf("Release of a key with a point = %v; want ErrHasRecoveryPoint", err)
	}
	checkRecord(t, "Get after the refused Release", e.get("s", "k"), before)
	if err := samePoint(e.point("k"), "charging", "params", at); err != nil {
		t.Fatalf("after the refused Release: %v", err)
	}
	// A stale token releases nothing, with ReleaseWithPoint either.
	e.clock.Advance(lease + time.Millisecond)
	c2, err := e.rec.Claim(e.ctx, e.req("k", "fp"))
	if err != nil || !c2.TookOver {
		t.Fatalf("takeover = %v, %v", c2.Outcome, err)
	}
	if err := e.rec.ReleaseWithPoint(e.ctx, keyRef("k", c)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("ReleaseWithPoint by the stale holder = %v; want ErrLeaseLost", err)
	}
	if err := e.rec.Release(e.ctx, keyRef("k", c)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Release by the stale holder = %v; want ErrLeaseLost", err)
	}
	// The holder that learned nothing happened outside releases it.
	if err := e.rec.ReleaseWithPoint(e.ctx, keyRef("k", c2)); err != nil {
		t.Fatalf("ReleaseWithPoint by the holder = %v", err)
	}
	if _, err := e.rec.Get(e.ctx, "s", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after ReleaseWithPoint = %v; want ErrNotFound", err)
	}
	if err := e.rec.ReleaseWithPoint(e.ctx, keyRef("k", c2)); err != nil {
		t.Fatalf("ReleaseWithPoint of a key already gone = %v; want nil", err)
	}
	if c3 := e.acquire("k"); c3.TookOver || !c3.Record.Recovery.IsZero() {
		t.Fatalf("Claim after ReleaseWithPoint = took over %v, point %+v; want the key anew", c3.TookOver, c3.Record.Recovery)
	}
	// A completed key is not the holder's to release either way.
	d := e.acquire("done")
	e.save(keyRef("done", d), "charging", "")
	if err := e.rec.Complete(e.ctx, keyRef("done", d), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := e.rec.ReleaseWithPoint(e.ctx, keyRef("done", d)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("ReleaseWithPoint of a completed key = %v; want ErrLeaseLost", err)
	}
}
