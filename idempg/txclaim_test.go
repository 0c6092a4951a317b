package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
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
				if err := await(tctx, claimed[1-i]); err != nil {
					return err
				}
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
		if r := receive(t, crossed, "a transaction's claim of the other's key did not return"); r.err != nil || r.c.Outcome != idem.InFlight {
			t.Errorf("a claim of the key the other transaction holds = %v, %v; want InFlight, no deadlock", r.c.Outcome, r.err)
		}
	}
}

// A claim in a transaction (WithTx) of a key that exists and must be
// written to be claimed (its lease ended) takes it over, in that
// transaction, unless another transaction holds the key's row (its holder
// completing it in a transaction of its own): then it answers InFlight at
// once, rather than wait for that transaction, so that claims in
// transactions never wait on one another.
func TestClaimInTxTakesOverAKeyWhoseLeaseEnded(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
	store := newStore(t, db)
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	first := mustClaim(t, store, req)
	clock.Advance(req.Lease)

	holding, release := make(chan struct{}), make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		holderDone <- db.WithTx(ctx, func(tctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(tctx, `SELECT 1 FROM idem_keys WHERE scope = $1 AND key = $2 FOR UPDATE`, "s", "k")
			close(holding)
			if werr := await(tctx, release); werr != nil {
				return werr
			}
			return err
		})
	}()
	receive(t, holding, "the other transaction did not lock the key's row")
	err := db.WithTx(ctx, func(tctx context.Context, _ pgx.Tx) error {
		// Bounded, so that a claim that waits for the row fails the test
		// instead of waiting for the other transaction.
		wctx, cancel := context.WithTimeout(tctx, 5*time.Second)
		defer cancel()
		if c, err := store.Claim(wctx, req); err != nil || c.Outcome != idem.InFlight {
			t.Errorf("a claim in a transaction of the key whose row another transaction holds = %v, %v; want InFlight at once", c.Outcome, err)
		}
		return nil
	})
	close(release)
	if herr := receive(t, holderDone, "the transaction holding the row did not end once let go"); herr != nil || err != nil {
		t.Fatalf("the transactions: %v, %v", herr, err)
	}

	var got idem.Claim
	err = db.WithTx(ctx, func(tctx context.Context, _ pgx.Tx) error {
		var err error
		got, err = store.Claim(tctx, req)
		return err
	})
	if err != nil || got.Outcome != idem.Acquired || !got.TookOver || got.Token == first.Token {
		t.Fatalf("a claim in a transaction of the key whose lease ended = %v (took over %v, token %v, first's %v), %v; want it taken over", got.Outcome, got.TookOver, got.Token, first.Token, err)
	}
	if rec, err := store.Get(ctx, "s", "k"); err != nil || rec.State != idem.StateInFlight || rec.Token != got.Token {
		t.Errorf("the key after the transaction committed: %v under %v, %v; want in flight under %v", rec.State, rec.Token, err, got.Token)
	}
}
