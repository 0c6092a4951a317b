package idempg_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// countUpdates makes the schema of db count the updates of idem_keys' rows
// (a trigger, for the test only), and returns the count so far.
func countUpdates(t *testing.T, db *idempg.DB) func() int {
	t.Helper()
	_, err := db.Pool().Exec(t.Context(), `
		CREATE TABLE key_updates (n int NOT NULL);
		CREATE FUNCTION count_key_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO key_updates VALUES (1); RETURN NULL; END $$;
		CREATE TRIGGER count_key_updates AFTER UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION count_key_update();`)
	if err != nil {
		t.Fatal(err)
	}
	return func() int {
		var n int
		if err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM key_updates`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// At READ COMMITTED, ClaimTx writes a new key's row once, completed, with
// the commit: no row in flight first, no update at the end. At the
// stricter levels, whose snapshot is taken before the key's lock can be
// waited for, the row is inserted in flight and then completed.
func TestClaimTxWritesTheRowOnce(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, tc := range []struct {
		iso         pgx.TxIsoLevel
		wantUpdates int
	}{{pgx.ReadCommitted, 0}, {pgx.RepeatableRead, 1}, {pgx.Serializable, 1}} {
		t.Run(string(tc.iso), func(t *testing.T) {
			t.Parallel()
			db := openDB(t, url, idempg.Config{TxOptions: pgx.TxOptions{IsoLevel: tc.iso}})
			migratePayments(t, db)
			store := newStore(t, db)
			updates := countUpdates(t, db)
			req := idem.ClaimRequest{Scope: "merchant", Key: "order-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			var seen idem.Claim
			c, kept, err := store.ClaimTx(t.Context(), req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
				seen = c
				return payWork(db, "pay_1", true, nil)(ctx)
			})
			if err != nil || !kept || c.Outcome != idem.Acquired || c.Token == 0 || seen.Token != c.Token {
				t.Fatalf("ClaimTx = %+v, %v, %v; want acquired and kept, the work under the same token", c, kept, err)
			}
			rec, err := store.Get(t.Context(), req.Scope, req.Key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != idem.StateCompleted || rec.Token != c.Token || string(rec.Response.Body) != "pay_1" ||
				!rec.CreatedAt.Equal(c.Record.CreatedAt) || !rec.LeaseExpiresAt.Equal(c.Record.LeaseExpiresAt) ||
				!rec.ExpiresAt.Equal(c.Record.ExpiresAt) || rec.ExpiresAt.Sub(rec.CreatedAt) != time.Hour {
				t.Errorf("record %+v does not match the claim %+v", rec, c.Record)
			}
			if got := updates(); got != tc.wantUpdates {
				t.Errorf("%d updates of idem_keys, want %d", got, tc.wantUpdates)
			}
		})
	}
}

// While ClaimTx's work runs, the key has no row: its lock alone keeps
// Store.Claim, on another replica, from claiming it. The Claim waits for
// the lock, then finds the key completed; a Claim of another key does not
// wait.
func TestClaimTxLockHoldsOffClaim(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	app := randomName("claimlock")
	first := openDB(t, url, idempg.Config{Schema: schema})
	second := openDB(t, withAppName(url, app), idempg.Config{Schema: schema})
	migratePayments(t, first)
	holder, other := newStore(t, first), newStore(t, second)
	req := idem.ClaimRequest{Scope: "merchant", Key: "order-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	wrote, proceed := make(chan struct{}), make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		_, kept, err := holder.ClaimTx(ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
			if err := insertPayment(ctx, first, "first"); err != nil {
				return idem.Response{}, false, err
			}
			close(wrote)
			if err := await(ctx, proceed); err != nil {
				return idem.Response{}, false, err
			}
			return idem.Response{Status: 201, Body: []byte("first")}, true, nil
		})
		if err == nil && !kept {
			err = errors.New("not kept")
		}
		holderDone <- err
	}()
	receive(t, wrote, "ClaimTx's work did not write")

	if _, err := other.Get(ctx, req.Scope, req.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get while the work runs: %v; want ErrNotFound (no row yet)", err)
	}
	otherKey := req
	otherKey.Key = "order-2"
	if c, err := other.Claim(ctx, otherKey); err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim of another key = %v, %v; want acquired at once", c.Outcome, err)
	}

	claimed := make(chan idem.Claim, 1)
	claimErr := make(chan error, 1)
	go func() {
		c, err := other.Claim(ctx, req)
		claimed <- c
		claimErr <- err
	}()
	waitingOn(t, second, app, "WITH l AS MATERIALIZED")
	close(proceed)
	if err := receive(t, holderDone, "ClaimTx did not return once its work did"); err != nil {
		t.Fatalf("ClaimTx: %v", err)
	}
	c, err := receive(t, claimed, "the waiting Claim did not return once ClaimTx committed"), <-claimErr
	if err != nil || c.Outcome != idem.Completed || string(c.Record.Response.Body) != "first" {
		t.Fatalf("the waiting Claim = %+v, %v; want the first execution's answer", c, err)
	}
	if got := payments(t, first); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("payments = %v, want [first]", got)
	}
}

// A claimant that does not take the key's lock (a replica of an earlier
// release) may write the key's row while ClaimTx's work runs: ClaimTx then
// rolls back everything the work wrote and returns idem.ErrLeaseLost, and
// the other claimant's row stays.
func TestClaimTxRowWrittenWithoutTheLock(t *testing.T) {
	t.Parallel()
	f := newClaimTxFixture(t)
	var token idem.Token
	c, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		token = c.Token
		if err := insertPayment(ctx, f.db, "second"); err != nil {
			return idem.Response{}, false, err
		}
		// An earlier release's claim: the row in flight, committed on a
		// connection of its own, without the lock.
		_, err := f.db.Pool().Exec(context.WithoutCancel(ctx), `INSERT INTO idem_keys
			(scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at)
			VALUES ($1, $2, 'fp', 'in_flight', $3, $4::timestamptz, $4::timestamptz + interval '1 minute', $4::timestamptz + interval '1 hour')`,
			string(f.req.Scope), string(f.req.Key), int64(c.Token)-1, f.clock.Now())
		if err != nil {
			return idem.Response{}, false, err
		}
		return idem.Response{Status: 201, Body: []byte("second")}, true, nil
	})
	if !errors.Is(err, idem.ErrLeaseLost) || kept || c.Outcome != idem.Acquired {
		t.Fatalf("ClaimTx = %v, kept %v, %v; want acquired, not kept, ErrLeaseLost", c.Outcome, kept, err)
	}
	if got := payments(t, f.db); len(got) != 0 {
		t.Errorf("payments = %v, want none: the work was rolled back", got)
	}
	rec, err := f.get(t)
	if err != nil || rec.State != idem.StateInFlight || rec.Token != token-1 {
		t.Errorf("record = %+v, %v; want the other claimant's, in flight", rec, err)
	}
}
