package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// A claim in a transaction (WithTx) holds no lock on a key it does not
// acquire, as idempgsql's claims in a transaction do not: a replay of a
// completed key leaves the key free for other claims while the transaction
// runs, and two transactions claiming two keys in opposite orders do not
// deadlock (each answers the other's key InFlight at once).
func TestClaimInTxLocks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openDB(t, pgURL(t), idempg.Config{})
	store := newStore(t, db)
	req := func(key string) idem.ClaimRequest {
		return idem.ClaimRequest{Scope: "s", Key: idem.Key(key), Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	}
	done := mustClaim(t, store, req("done"))
	if err := store.Complete(ctx, refOf(done), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}

	err := db.WithTx(ctx, func(tctx context.Context, _ pgx.Tx) error {
		if c, err := store.Claim(tctx, req("done")); err != nil || c.Outcome != idem.Completed {
			t.Fatalf("the replay in a transaction = %v, %v", c.Outcome, err)
		}
		// Bounded, so that on a store that keeps the key locked the test
		// fails instead of waiting for the transaction.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if c, err := store.Claim(wctx, req("done")); err != nil || c.Outcome != idem.Completed {
			t.Errorf("a claim of the replayed key while the replaying transaction is open = %v, %v; want Completed at once", c.Outcome, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// T1 claims k1 and T2 k2; then each claims the other's.
	type result struct {
		c   idem.Claim
		err error
	}
	claimed := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	crossed := make(chan result, 2)
	for i, keys := range [2][2]string{{"k1", "k2"}, {"k2", "k1"}} {
		go func() {
			var r result
			err := db.WithTx(ctx, func(tctx context.Context, _ pgx.Tx) error {
				if c, err := store.Claim(tctx, req(keys[0])); err != nil || c.Outcome != idem.Acquired {
					t.Errorf("T%d claims %s = %v, %v", i+1, keys[0], c.Outcome, err)
				}
				close(claimed[i])
				<-claimed[1-i]
				r.c, r.err = store.Claim(tctx, req(keys[1]))
				return nil
			})
			if r.err == nil {
				r.err = err
			}
			crossed <- r
		}()
	}
	for range 2 {
		if r := <-crossed; r.err != nil || r.c.Outcome != idem.InFlight {
			t.Errorf("a claim of the key the other transaction holds = %v, %v; want InFlight, no deadlock", r.c.Outcome, r.err)
		}
	}
}
