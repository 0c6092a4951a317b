package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// handClock is a clock the test moves by hand.
type handClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *handClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *handClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// renewalQueued waits until q has n renewals queued.
func renewalQueued(t *testing.T, q *writerQueue, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q.mu.Lock()
		got := len(q.renewals)
		q.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals queued, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// renewFixture is a key claimed at t0 with a one-second lease, and a
// transaction that has written and holds the writer until release is
// closed, then runs then (if not nil) and ends.
type renewFixture struct {
	db      *DB
	store   *Store
	clock   *handClock
	t0      time.Time
	ref     idem.Ref
	req     idem.ClaimRequest
	release chan struct{}
	held    chan error
}

func newRenewFixture(t *testing.T, then func(ctx context.Context, f *renewFixture) error) *renewFixture {
	t.Helper()
	f := &renewFixture{db: groupDB(t, time.Hour), t0: time.Unix(1_800_000_000, 0).UTC()}
	f.clock = &handClock{now: f.t0}
	var err error
	if f.store, err = NewStore(t.Context(), f.db, &StoreConfig{Clock: f.clock}); err != nil {
		t.Fatal(err)
	}
	f.req = idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour,
		Holder: idem.Holder{Replica: "r", Incarnation: "1"}}
	claim, err := f.store.Claim(t.Context(), f.req)
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", claim, err)
	}
	f.ref = idem.Ref{Scope: "s", Key: "k", Token: claim.Token}
	var fn func(ctx context.Context) error
	if then != nil {
		fn = func(ctx context.Context) error { return then(ctx, f) }
	}
	f.release, f.held = holdWriter(t, f.db, fn)
	return f
}

// holdWriter starts a transaction on db that writes, so holding the
// writer, and returns once it holds the writer's turn. The transaction
// then waits until release is closed, runs then (if not nil) in it, and
// ends; held receives WithTx's result.
func holdWriter(t *testing.T, db *DB, then func(ctx context.Context) error) (release chan struct{}, held chan error) {
	t.Helper()
	release, held = make(chan struct{}), make(chan error, 1)
	go func() {
		held <- db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES ('holder')`); err != nil {
				return err
			}
			<-release
			if then != nil {
				return then(ctx)
			}
			return nil
		})
	}()
	queuedOrHolding(t, &db.queue)
	return release, held
}

// renewQueued renews f's key at at while the writer is held: Renew
// returns at once, its renewal queued.
func (f *renewFixture) renewQueued(t *testing.T, at time.Time) time.Time {
	t.Helper()
	f.clock.set(at)
	end, err := f.store.Renew(t.Context(), f.ref, f.req.Lease)
	if err != nil {
		t.Fatalf("a renewal while the writer is held: %v", err)
	}
	if want := at.Add(f.req.Lease); !end.Equal(want) {
		t.Fatalf("the renewal's lease ends at %v, want %v", end, want)
	}
	renewalQueued(t, &f.db.queue, 1)
	return end
}

// A renewal asked for while another transaction holds the writer is not
// refused for want of it; a claim that comes once the key's first lease
// has ended, but not its renewed one, finds the key in flight, although it
// joins the group of the transaction that held the writer; and the renewal
// is written by then.
func TestRenewQueuedBehindTheWriterHoldsOffAClaim(t *testing.T) {
	f := newRenewFixture(t, nil)
	end := f.renewQueued(t, f.t0.Add(500*time.Millisecond))
	f.clock.set(f.t0.Add(1200 * time.Millisecond)) // the first lease has ended
	type result struct {
		claim idem.Claim
		err   error
	}
	claimed := make(chan result, 1)
	go func() {
		req := f.req
		req.Holder = idem.Holder{Replica: "other", Incarnation: "1"}
		c, err := f.store.Claim(t.Context(), req)
		claimed <- result{c, err}
	}()
	queued(t, &f.db.queue, 1)
	close(f.release)
	if err := <-f.held; err != nil {
		t.Fatal(err)
	}
	c := <-claimed
	if c.err != nil || c.claim.Outcome != idem.InFlight || !c.claim.Record.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the claim after the first lease ended: %v, lease to %v, %v; want in flight to %v", c.claim.Outcome, c.claim.Record.LeaseExpiresAt, c.err, end)
	}
	rec, err := f.store.Get(t.Context(), "s", "k")
	if err != nil || rec.Token != f.ref.Token || !rec.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the key: token %d, lease to %v, %v; want token %d to %v", rec.Token, rec.LeaseExpiresAt, err, f.ref.Token, end)
	}
}

// A renewal written into a group that then fails is written again on its
// own before the writer passes on.
func TestRenewWrittenAgainAfterItsGroupFailed(t *testing.T) {
	f := newRenewFixture(t, nil)
	end := f.renewQueued(t, f.t0.Add(500*time.Millisecond))
	failing := make(chan error, 1)
	go func() {
		failing <- f.db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO children (id, parent) VALUES ('orphan', 'nobody')`)
			return err
		})
	}()
	queued(t, &f.db.queue, 1)
	close(f.release)
	var te *txError
	if err := <-f.held; !errors.As(err, &te) || te.op != "commit" {
		t.Fatalf("the holder: %v; want its group's commit error", err)
	}
	if err := <-failing; err == nil {
		t.Fatal("the group committed")
	}
	rec, err := f.store.Get(t.Context(), "s", "k")
	if err != nil || rec.Token != f.ref.Token || !rec.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the key: token %d, lease to %v, %v; want token %d to %v", rec.Token, rec.LeaseExpiresAt, err, f.ref.Token, end)
	}
	f.db.queue.mu.Lock()
	defer f.db.queue.mu.Unlock()
	if n := len(f.db.queue.renewals); n != 0 {
		t.Errorf("%d renewals still queued", n)
	}
}

// A yield in the transaction that holds the writer drops the renewals
// queued for its lease: none is written after it, to give the key a live
// lease again.
func TestYieldDropsQueuedRenewals(t *testing.T) {
	f := newRenewFixture(t, func(ctx context.Context, f *renewFixture) error {
		return f.store.Yield(ctx, f.ref)
	})
	f.renewQueued(t, f.t0.Add(500*time.Millisecond))
	close(f.release)
	if err := <-f.held; err != nil {
		t.Fatal(err)
	}
	rec, err := f.store.Get(t.Context(), "s", "k")
	if err != nil || !rec.LeaseExpiresAt.Equal(f.clock.Now()) {
		t.Fatalf("the key's lease ends at %v (%v), want %v, when it was yielded", rec.LeaseExpiresAt, err, f.clock.Now())
	}
}

// A YieldEarlier in the transaction that holds the writer drops the
// renewals queued for the leases it ends, as Yield does for its own: a
// renewal written after it would give the key of an earlier incarnation
// a live lease again, and a restarted replica would wait for it to end
// instead of taking its keys back at once.
func TestYieldEarlierDropsQueuedRenewals(t *testing.T) {
	f := newRenewFixture(t, func(ctx context.Context, f *renewFixture) error {
		n, err := f.store.YieldEarlier(ctx, idem.Holder{Replica: "r", Incarnation: "2"})
		if err == nil && n != 1 {
			err = fmt.Errorf("YieldEarlier ended %d leases, want 1", n)
		}
		return err
	})
	f.renewQueued(t, f.t0.Add(500*time.Millisecond))
	close(f.release)
	if err := <-f.held; err != nil {
		t.Fatal(err)
	}
	rec, err := f.store.Get(t.Context(), "s", "k")
	if err != nil || !rec.LeaseExpiresAt.Equal(f.clock.Now()) {
		t.Fatalf("the key's lease ends at %v (%v), want %v, when the earlier incarnation's leases were ended", rec.LeaseExpiresAt, err, f.clock.Now())
	}
}

// A claim that holds the writer when a renewal is queued, and reads the
// time after it, decides as if the renewal were written: it finds the key
// in flight to the renewed lease's end, and the renewal is written once
// the claim hands the writer over.
func TestClaimHonoursARenewalQueuedWhileItHoldsTheWriter(t *testing.T) {
	db := groupDB(t, time.Hour)
	t0 := time.Unix(1_800_000_000, 0).UTC()
	clock := &handClock{now: t0}
	store, err := NewStore(t.Context(), db, &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	first, err := store.Claim(t.Context(), req)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", first, err)
	}
	ref := idem.Ref{Scope: "s", Key: "k", Token: first.Token}
	// The claim's turn, taken before the renewal is asked for.
	if err := db.queue.acquire(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	clock.set(t0.Add(500 * time.Millisecond))
	r, queued := db.queue.queueRenewal(ref, req.Lease, clock.Now)
	if !queued {
		t.Fatal("the renewal was not queued while the writer's turn was held")
	}
	end := fromNanos(r.end)
	clock.set(t0.Add(1200 * time.Millisecond))
	var c idem.Claim
	err = db.unsyncedTxHeld(t.Context(), false, func(ctx context.Context, tx *sql.Tx) (err error) {
		c, err = store.claimIn(ctx, db.in(tx), req)
		return err
	})
	if err != nil || c.Outcome != idem.InFlight || !c.Record.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the claim: %v, lease to %v, %v; want in flight to %v", c.Outcome, c.Record.LeaseExpiresAt, err, end)
	}
	<-r.done
	if r.err != nil {
		t.Fatalf("the renewal, written at the hand-over: %v", r.err)
	}
	rec, err := store.Get(t.Context(), "s", "k")
	if err != nil || rec.Token != ref.Token || !rec.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the key: token %d, lease to %v, %v; want token %d to %v", rec.Token, rec.LeaseExpiresAt, err, ref.Token, end)
	}
}

// A renewal queued behind a transaction that holds the writer is refused
// at once (ErrLeaseLost) when the key's committed record shows it taken
// over: its holder learns that it lost the key without waiting for the
// writer, and the renewal, written later, does not move the new lease.
func TestRenewQueuedBehindTheWriterTellsALeaseAlreadyTakenOver(t *testing.T) {
	db := groupDB(t, time.Hour)
	t0 := time.Unix(1_800_000_000, 0).UTC()
	clock := &handClock{now: t0}
	store, err := NewStore(t.Context(), db, &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	first, err := store.Claim(t.Context(), req)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", first, err)
	}
	clock.set(t0.Add(2 * time.Second))
	second, err := store.Claim(t.Context(), req)
	if err != nil || second.Outcome != idem.Acquired || !second.TookOver {
		t.Fatalf("the takeover: %+v, %v; want acquired, taken over", second, err)
	}
	release, held := holdWriter(t, db, nil)
	clock.set(t0.Add(2500 * time.Millisecond))
	if end, err := store.Renew(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: first.Token}, req.Lease); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the first holder's renewal behind the writer = %v, %v; want ErrLeaseLost", end, err)
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(t.Context(), "s", "k")
	if want := second.Record.LeaseExpiresAt; err != nil || rec.Token != second.Token || !rec.LeaseExpiresAt.Equal(want) {
		t.Fatalf("the key: token %d, lease to %v, %v; want the new holder's token %d to %v", rec.Token, rec.LeaseExpiresAt, err, second.Token, want)
	}
}

// A claim that decides while a renewal of the key is queued answers with
// the record as that renewal writes it, even one whose lease end is the
// one the key already has: writing it still moves the key's expiry out to
// that end (a takeover late in the key's TTL gives a lease that outlasts
// the expiry), and the claim's answer must not show an expiry the key no
// longer has once the claim hands the writer over.
func TestClaimAnswersWithTheExpiryAQueuedRenewalWrites(t *testing.T) {
	db := groupDB(t, time.Hour)
	t0 := time.Unix(1_800_000_000, 0).UTC()
	clock := &handClock{now: t0}
	store, err := NewStore(t.Context(), db, &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: 10 * time.Second}
	if c, err := store.Claim(t.Context(), req); err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	clock.set(t0.Add(9500 * time.Millisecond))
	taken, err := store.Claim(t.Context(), req)
	if err != nil || taken.Outcome != idem.Acquired || !taken.TookOver {
		t.Fatalf("the takeover: %+v, %v; want acquired, taken over", taken, err)
	}
	if rec, err := store.Get(t.Context(), "s", "k"); err != nil || !rec.ExpiresAt.Before(rec.LeaseExpiresAt) {
		t.Fatalf("after the takeover: lease to %v, expiry %v, %v; want the lease past the expiry", rec.LeaseExpiresAt, rec.ExpiresAt, err)
	}
	ref := idem.Ref{Scope: "s", Key: "k", Token: taken.Token}
	// The claim's turn, taken before the renewal is asked for, at the
	// takeover's instant: the renewal's lease end is the key's.
	if err := db.queue.acquire(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	r, queued := db.queue.queueRenewal(ref, req.Lease, clock.Now)
	if !queued || !fromNanos(r.end).Equal(taken.Record.LeaseExpiresAt) {
		t.Fatalf("the renewal: queued %v, to %v; want queued, to %v", queued, fromNanos(r.end), taken.Record.LeaseExpiresAt)
	}
	clock.set(t0.Add(10200 * time.Millisecond)) // past the expiry, within the lease
	var c idem.Claim
	err = db.unsyncedTxHeld(t.Context(), false, func(ctx context.Context, tx *sql.Tx) (err error) {
		c, err = store.claimIn(ctx, db.in(tx), req)
		return err
	})
	if err != nil || c.Outcome != idem.InFlight {
		t.Fatalf("the claim: %v, %v; want in flight", c.Outcome, err)
	}
	<-r.done
	if r.err != nil {
		t.Fatalf("the renewal, written at the hand-over: %v", r.err)
	}
	rec, err := store.Get(t.Context(), "s", "k")
	if err != nil || !c.Record.ExpiresAt.Equal(rec.ExpiresAt) || !c.Record.LeaseExpiresAt.Equal(rec.LeaseExpiresAt) {
		t.Fatalf("the claim answered lease to %v, expiry %v; the key holds lease to %v, expiry %v (%v)",
			c.Record.LeaseExpiresAt, c.Record.ExpiresAt, rec.LeaseExpiresAt, rec.ExpiresAt, err)
	}
}

// shorterRenewalQueued claims a key at t0 for ten seconds, takes the
// writer's turn for a claim, and queues a renewal of the key's lease for
// one second at t0+0.5s: a renewal that shortens the lease, as Renew may
// (its end replaces the old one, earlier or later). It returns the store,
// the claim's request, the renewal and its end.
func shorterRenewalQueued(t *testing.T) (*DB, *Store, *handClock, idem.ClaimRequest, *renewal, time.Time) {
	t.Helper()
	db := groupDB(t, time.Hour)
	t0 := time.Unix(1_800_000_000, 0).UTC()
	clock := &handClock{now: t0}
	store, err := NewStore(t.Context(), db, &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour}
	first, err := store.Claim(t.Context(), req)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", first, err)
	}
	ref := idem.Ref{Scope: "s", Key: "k", Token: first.Token}
	if err := db.queue.acquire(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	clock.set(t0.Add(500 * time.Millisecond))
	r, queued := db.queue.queueRenewal(ref, time.Second, clock.Now)
	if !queued {
		t.Fatal("the renewal was not queued while the writer's turn was held")
	}
	return db, store, clock, req, r, fromNanos(r.end)
}

// A claim that decides while a renewal that shortens the key's lease is
// queued answers with the lease end that renewal writes, not the longer
// one the key's committed record still shows: once the claim hands the
// writer over, the key's lease ends when the renewal says.
func TestClaimAnswersWithTheEndAShorterQueuedRenewalWrites(t *testing.T) {
	db, store, clock, req, r, end := shorterRenewalQueued(t)
	clock.set(end.Add(-100 * time.Millisecond))
	var c idem.Claim
	err := db.unsyncedTxHeld(t.Context(), false, func(ctx context.Context, tx *sql.Tx) (err error) {
		c, err = store.claimIn(ctx, db.in(tx), req)
		return err
	})
	if err != nil || c.Outcome != idem.InFlight {
		t.Fatalf("the claim: %v, %v; want in flight", c.Outcome, err)
	}
	<-r.done
	if r.err != nil {
		t.Fatalf("the renewal, written at the hand-over: %v", r.err)
	}
	rec, err := store.Get(t.Context(), "s", "k")
	if err != nil || !rec.LeaseExpiresAt.Equal(end) || !c.Record.LeaseExpiresAt.Equal(rec.LeaseExpiresAt) {
		t.Fatalf("the claim answered lease to %v; the key holds lease to %v (%v); want both %v",
			c.Record.LeaseExpiresAt, rec.LeaseExpiresAt, err, end)
	}
}

// A claim that comes after the end a queued renewal shortened the key's
// lease to takes the key over, as it would once that renewal is written:
// the holder was told its lease ends then. The renewal, written after the
// takeover, moves nothing.
func TestClaimTakesOverALeaseAQueuedRenewalShortened(t *testing.T) {
	db, store, clock, req, r, end := shorterRenewalQueued(t)
	clock.set(end.Add(100 * time.Millisecond))
	var c idem.Claim
	err := db.unsyncedTxHeld(t.Context(), false, func(ctx context.Context, tx *sql.Tx) (err error) {
		c, err = store.claimIn(ctx, db.in(tx), req)
		return err
	})
	if err != nil || c.Outcome != idem.Acquired || !c.TookOver {
		t.Fatalf("the claim %v after the renewed lease's end: %v, taken over %v, %v; want acquired, taken over",
			clock.Now().Sub(end), c.Outcome, c.TookOver, err)
	}
	<-r.done
	if !errors.Is(r.err, idem.ErrLeaseLost) {
		t.Fatalf("the renewal, written after the takeover: %v; want ErrLeaseLost", r.err)
	}
	rec, err := store.Get(t.Context(), "s", "k")
	if err != nil || rec.Token != c.Token || !rec.LeaseExpiresAt.Equal(c.Record.LeaseExpiresAt) {
		t.Fatalf("the key: token %d, lease to %v, %v; want the taker's token %d to %v", rec.Token, rec.LeaseExpiresAt, err, c.Token, c.Record.LeaseExpiresAt)
	}
}

// A claim answered from the read pool (a duplicate of a key in flight,
// without the writer) honours a renewal queued behind the writer as the
// writer's claims do: one that shortened the key's lease. Before its end
// the claim answers in flight with that end; after it, the claim goes to
// the writer, and takes the key over once the writer is handed over, as a
// claim on the writer decides (TestClaimTakesOverALeaseAQueuedRenewalShortened).
func TestClaimFromTheReaderHonoursAShorterQueuedRenewal(t *testing.T) {
	db := groupDB(t, time.Hour)
	t0 := time.Unix(1_800_000_000, 0).UTC()
	clock := &handClock{now: t0}
	store, err := NewStore(t.Context(), db, &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour}
	first, err := store.Claim(t.Context(), req)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", first, err)
	}
	release, held := holdWriter(t, db, nil)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	clock.set(t0.Add(500 * time.Millisecond))
	end, err := store.Renew(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: first.Token}, time.Second)
	if err != nil {
		t.Fatalf("the renewal behind the writer: %v", err)
	}

	clock.set(end.Add(-100 * time.Millisecond))
	c, err := store.Claim(t.Context(), req)
	if err != nil || c.Outcome != idem.InFlight || !c.Record.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the claim %v before the renewed lease's end: %v, lease to %v, %v; want in flight, lease to %v",
			end.Sub(clock.Now()), c.Outcome, c.Record.LeaseExpiresAt, err, end)
	}

	clock.set(end.Add(100 * time.Millisecond))
	type answer struct {
		c   idem.Claim
		err error
	}
	taken := make(chan answer, 1)
	go func() {
		c, err := store.Claim(t.Context(), req)
		taken <- answer{c, err}
	}()
	// It answers at once from the read pool, or waits for the writer's
	// turn.
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		select {
		case a := <-taken:
			t.Fatalf("the claim %v after the renewed lease's end answered without the writer: %v, lease to %v, %v; want it to wait for the writer and take the key over",
				clock.Now().Sub(end), a.c.Outcome, a.c.Record.LeaseExpiresAt, a.err)
		default:
		}
		db.queue.mu.Lock()
		waiting := len(db.queue.waiting)
		db.queue.mu.Unlock()
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim neither answered nor waited for the writer")
		}
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	a := <-taken
	if a.err != nil || a.c.Outcome != idem.Acquired || !a.c.TookOver {
		t.Fatalf("the claim after the renewed lease's end: %v, taken over %v, %v; want acquired, taken over", a.c.Outcome, a.c.TookOver, a.err)
	}
}
