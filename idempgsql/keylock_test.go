// This file tests the key's lock as every claimant shares it: a claim in
// the application's transaction, a claim on its own, and idempg's ClaimTx,
// which holds a new key by that lock alone while its work runs.

package idempgsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idempgsql"
)

// openIdempg is an idempg Store on schema, through a pool of pgx's own.
func openIdempg(t *testing.T, schema string) *idempg.Store {
	t.Helper()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, withParam(pgURL(t), "search_path="+schema+"&pool_max_conns=3"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := idempg.NewDB(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := idempg.NewStore(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func keyReq(key string) idem.ClaimRequest {
	return idem.ClaimRequest{Scope: "s", Key: idem.Key(key), Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
}

type claimTxResult struct {
	claim idem.Claim
	kept  bool
	err   error
}

// holdByClaimTx starts idempg's ClaimTx of key, and returns once its work
// runs (holding the key by its lock alone, no row written yet), with a
// function that lets the work finish, keeping its answer, and returns
// ClaimTx's result.
func holdByClaimTx(t *testing.T, s *idempg.Store, key string) (finish func() claimTxResult) {
	t.Helper()
	inWork, release := make(chan struct{}), make(chan struct{})
	done := make(chan claimTxResult, 1)
	go func() {
		c, kept, err := s.ClaimTx(context.WithoutCancel(t.Context()), keyReq(key), time.Second,
			func(context.Context, idem.Claim) (idem.Response, bool, error) {
				close(inWork)
				<-release
				return idem.Response{Status: 201}, true, nil
			})
		done <- claimTxResult{c, kept, err}
	}()
	select {
	case <-inWork:
	case r := <-done:
		t.Fatalf("ClaimTx ran no work: %v, %v", r.claim.Outcome, r.err)
	}
	return func() claimTxResult {
		close(release)
		return <-done
	}
}

// A claim in the application's transaction and idempg's ClaimTx never both
// hold one key: while ClaimTx's work runs, the joined claim answers
// InFlight (rather than acquiring the key and running its effect beside
// the work); while a joined claim holds a key, ClaimTx answers InFlight
// after its wait, without running its work.
func TestJoinedClaimAndClaimTx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store, pg := newStore(t, db), openIdempg(t, db.Schema())
		k1, k2 := randomName("k1-"), randomName("k2-") // no other test's: the lock may be shared

		finish := holdByClaimTx(t, pg, k1)
		tx := begin(t, db, nil)
		c, err := store.Claim(db.JoinTx(ctx, tx), keyReq(k1))
		if err != nil || c.Outcome != idem.InFlight {
			t.Errorf("a joined claim of a key ClaimTx holds = %v, %v; want InFlight", c.Outcome, err)
		}
		// Rolled back before ClaimTx completes, whose INSERT would wait
		// for a row this claim wrote.
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if r := finish(); r.err != nil || !r.kept || r.claim.Outcome != idem.Acquired {
			t.Errorf("ClaimTx = %v, kept %v, %v; want it to keep its answer", r.claim.Outcome, r.kept, r.err)
		}

		tx = begin(t, db, nil)
		if c, err := store.Claim(db.JoinTx(ctx, tx), keyReq(k2)); err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("the joined claim = %v, %v", c.Outcome, err)
		}
		ran := false
		c, kept, err := pg.ClaimTx(ctx, keyReq(k2), 50*time.Millisecond,
			func(context.Context, idem.Claim) (idem.Response, bool, error) {
				ran = true
				return idem.Response{}, false, nil // kept: its completion would wait for the joined claim's row
			})
		if err != nil || ran || kept || c.Outcome != idem.InFlight {
			t.Errorf("ClaimTx of a key a joined claim holds = %v, kept %v, %v, ran its work: %v; want InFlight, not run",
				c.Outcome, kept, err, ran)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	})
}

// The key's lock is the schema's: a ClaimTx holding a key in one schema
// neither delays nor answers the claims of the same scope and key in
// another schema, which has never seen the key (on its own, in the
// application's transaction, or idempg's ClaimTx).
func TestKeyLockPerSchema(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		dbA, dbB := openDB(t, driver, idempgsql.Config{}), openDB(t, driver, idempgsql.Config{})
		newStore(t, dbA)
		storeB, pgA, pgB := newStore(t, dbB), openIdempg(t, dbA.Schema()), openIdempg(t, dbB.Schema())

		for _, how := range []string{"alone", "joined", "claimtx"} {
			key := randomName(how + "-") // no other test's: the lock may be shared
			finish := holdByClaimTx(t, pgA, key)
			var c idem.Claim
			var err error
			switch how {
			case "alone":
				// Bounded, so that a claim that waits for the other
				// schema's transaction fails instead of hanging.
				bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				c, err = storeB.Claim(bctx, keyReq(key))
				cancel()
			case "joined":
				tx := begin(t, dbB, nil)
				c, err = storeB.Claim(dbB.JoinTx(ctx, tx), keyReq(key))
				if err == nil {
					err = tx.Commit()
				}
			case "claimtx":
				c, _, err = pgB.ClaimTx(ctx, keyReq(key), 50*time.Millisecond,
					func(context.Context, idem.Claim) (idem.Response, bool, error) {
						return idem.Response{Status: 201}, true, nil
					})
			}
			if err != nil || c.Outcome != idem.Acquired {
				t.Errorf("%s: a claim in schema B while ClaimTx holds the same scope and key in schema A = %v, %v; want Acquired",
					how, c.Outcome, err)
			}
			if r := finish(); r.err != nil || !r.kept {
				t.Errorf("%s: ClaimTx in schema A = %v, kept %v, %v", how, r.claim.Outcome, r.kept, r.err)
			}
		}
	})
}
