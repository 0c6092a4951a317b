package idempg_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// A Release, a Yield, a Complete or a YieldEarlier made in the caller's
// transaction (a context that carries a transaction of the DB) wakes the
// key's waiters when that transaction commits: a duplicate waiting for the
// key (WaitChange) claims it at once, or finds it completed, instead of
// waiting for a lease that no longer holds it (here an hour, the store's
// clock standing still).
func TestReleaseAndYieldInCallersTxWakeWaiters(t *testing.T) {
	t.Parallel()
	ends := map[string]struct {
		end  func(*idempg.Store, context.Context, idem.Ref) error
		want idem.Outcome
	}{
		"release": {(*idempg.Store).Release, idem.Acquired},
		"yield":   {(*idempg.Store).Yield, idem.Acquired},
		"complete": {func(s *idempg.Store, ctx context.Context, ref idem.Ref) error {
			return s.Complete(ctx, ref, idem.Response{Status: 201})
		}, idem.Completed},
		"yield earlier": {func(s *idempg.Store, ctx context.Context, _ idem.Ref) error {
			_, err := s.YieldEarlier(ctx, idem.Holder{Replica: "r", Incarnation: "2"})
			return err
		}, idem.Acquired},
	}
	for name, e := range ends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			wakesItsWaiter(t, name+" in a transaction", e.want, func(s *idempg.Store, db *idempg.DB, ctx context.Context, ref idem.Ref) error {
				return db.WithTx(ctx, func(tctx context.Context, _ pgx.Tx) error { return e.end(s, tctx, ref) })
			})
		})
	}
}

// A YieldEarlier on its own (no transaction carried) wakes the waiters of
// the keys it ended once it has committed, so that duplicates waiting for
// them take them over at once rather than at the end of their leases.
func TestTakeoverOfAKeyYieldedEarlierIsAtOnce(t *testing.T) {
	t.Parallel()
	wakesItsWaiter(t, "YieldEarlier", idem.Acquired, func(s *idempg.Store, _ *idempg.DB, ctx context.Context, _ idem.Ref) error {
		n, err := s.YieldEarlier(ctx, idem.Holder{Replica: "r", Incarnation: "2"})
		if err == nil && n != 1 {
			t.Errorf("YieldEarlier ended %d keys, want 1", n)
		}
		return err
	})
}

// wakesItsWaiter claims a key under an hour's lease, held by incarnation 1
// of replica r, on a store whose clock stands still, waits for it
// (WaitChange) and ends it with end: the waiter must wake, and its claim
// then be answered want.
func wakesItsWaiter(t *testing.T, name string, want idem.Outcome, end func(*idempg.Store, *idempg.DB, context.Context, idem.Ref) error) {
	t.Helper()
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
	s := newStore(t, db)
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Hour, TTL: 2 * time.Hour,
		Holder: idem.Holder{Replica: "r", Incarnation: "1"}}
	c := mustClaim(t, s, req)
	listening := idempg.Listening(s)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// The store's listener wakes every waiter once when it starts:
	// started, and past that wake, before the waiter comes. (Its
	// LISTEN shows in pg_stat_activity before the wake, and a
	// waiter that came between would return at once.)
	if err := s.WaitChange(ctx, req.Scope, "not-in-flight"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-listening:
	case <-ctx.Done():
		t.Fatal("the store's listener never listened")
	}
	woke := make(chan error, 1)
	go func() { woke <- s.WaitChange(ctx, req.Scope, req.Key) }()
	waitFor(t, ctx, "the waiter registered", func() (bool, error) {
		select {
		case err := <-woke:
			return false, fmt.Errorf("the waiter returned before the %s: %v", name, err)
		default:
		}
		var n int
		err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_waiters`).Scan(&n)
		return n > 0, err
	})
	if err := end(s, db, ctx, refOf(c)); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	select {
	case err := <-woke:
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("the waiter did not wake within 20s of the %s's commit (the key's lease runs an hour)", name)
	}
	req.Holder = idem.Holder{Replica: "r", Incarnation: "2"}
	if next, err := s.Claim(ctx, req); err != nil || next.Outcome != want {
		t.Errorf("the waiter's claim after the %s: %v, %v; want %v", name, next.Outcome, err, want)
	}
}
