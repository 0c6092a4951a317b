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

// A Release or a Yield made in the caller's transaction (a context that
// carries a transaction of the DB) wakes the key's waiters when that
// transaction commits: a duplicate waiting for the key (WaitChange) claims
// it at once, instead of waiting for a lease that no longer holds it (here
// an hour, the store's clock standing still).
func TestReleaseAndYieldInCallersTxWakeWaiters(t *testing.T) {
	t.Parallel()
	ops := map[string]func(*idempg.Store, context.Context, idem.Ref) error{
		"release": (*idempg.Store).Release,
		"yield":   (*idempg.Store).Yield,
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(idemtest.Start)
			db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
			s := newStore(t, db)
			req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Hour, TTL: 2 * time.Hour}
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
			err := db.WithTx(ctx, func(tctx context.Context, _ pgx.Tx) error {
				return op(s, tctx, refOf(c))
			})
			if err != nil {
				t.Fatalf("%s in a transaction: %v", name, err)
			}
			select {
			case err := <-woke:
				if err != nil {
					t.Fatalf("the waiter: %v", err)
				}
			case <-ctx.Done():
				t.Fatalf("the waiter did not wake within 20s of the %s's commit (the key's lease runs an hour)", name)
			}
			if next, err := s.Claim(ctx, req); err != nil || next.Outcome != idem.Acquired {
				t.Errorf("the waiter's claim after the %s: %v, %v; want acquired", name, next.Outcome, err)
			}
		})
	}
}
