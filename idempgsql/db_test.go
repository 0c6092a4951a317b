package idempgsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgsql"
)

// NewDB refuses what it cannot work with, and says how to mend it.
func TestNewDBRefuses(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		if _, err := idempgsql.NewDB(ctx, nil, nil); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("NewDB(nil) = %v, want an invalid argument", err)
		}
		sqldb := openSQL(t, driver)
		db, err := idempgsql.NewDB(ctx, sqldb, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The schema is the connections', and a Config naming it is fine.
		if _, err := idempgsql.NewDB(ctx, sqldb, &idempgsql.Config{Schema: db.Schema()}); err != nil {
			t.Errorf("NewDB with the connections' schema: %v", err)
		}
		if _, err := idempgsql.NewDB(ctx, sqldb, &idempgsql.Config{Schema: "elsewhere"}); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("NewDB with another schema = %v, want an invalid argument", err)
		}
		// Connections whose search_path names no schema that exists.
		lost, err := sql.Open(driver, withParam(pgURL(t), "search_path=idempgsql_no_such_schema"))
		if err != nil {
			t.Fatal(err)
		}
		defer lost.Close()
		if _, err := idempgsql.NewDB(ctx, lost, nil); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("NewDB on a missing schema = %v, want an invalid argument", err)
		}
	})
}

// A transaction of the application's, joined with JoinTx, carries a
// claim, an inbox row and an outbox entry: they roll back with it, or
// commit with it, and idem never ends it.
func TestJoinTx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store, inbox, fx := newStore(t, db), newInbox(t, db), newEffects(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
		writeAll := func(ctx context.Context) {
			t.Helper()
			if c, err := store.Claim(ctx, req); err != nil || c.Outcome != idem.Acquired {
				t.Fatalf("Claim = %v, %v", c.Outcome, err)
			}
			if err := inbox.Process(ctx, "c", "m1", func(ctx context.Context) error { return fx.Write(ctx, "effect") }); err != nil {
				t.Fatal(err)
			}
			if err := outbox.Add(ctx, idem.Message{ID: "e1", Topic: "t", Payload: []byte("p")}); err != nil {
				t.Fatal(err)
			}
		}
		count := func() (keys, effects, entries int) {
			t.Helper()
			if _, err := store.Get(ctx, "s", "k"); err == nil {
				keys = 1
			} else if !errors.Is(err, idem.ErrNotFound) {
				t.Fatal(err)
			}
			if effects, err = fx.Count(ctx, "effect"); err != nil {
				t.Fatal(err)
			}
			if err := db.SQL().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&entries); err != nil {
				t.Fatal(err)
			}
			return keys, effects, entries
		}

		tx, err := db.SQL().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		writeAll(db.JoinTx(ctx, tx))
		if k, e, o := count(); k+e+o != 0 {
			t.Fatalf("before the commit, others see %d keys, %d effects, %d entries", k, e, o)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatalf("the application's rollback: %v (idem must not end a joined transaction)", err)
		}
		if k, e, o := count(); k+e+o != 0 {
			t.Fatalf("after a rollback: %d keys, %d effects, %d entries", k, e, o)
		}

		tx, err = db.SQL().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		jctx := db.JoinTx(ctx, tx)
		writeAll(jctx)
		// The same message again, in the same transaction: a duplicate,
		// and the transaction stays usable.
		err = inbox.Process(jctx, "c", "m1", func(ctx context.Context) error { return fx.Write(ctx, "effect") })
		if !errors.Is(err, idem.ErrDuplicate) {
			t.Fatalf("Process again = %v, want ErrDuplicate", err)
		}
		// A failing handler rolls back to the inbox's savepoint: its write
		// and its row go, the transaction goes on.
		boom := errors.New("boom")
		err = inbox.Process(jctx, "c", "m2", func(ctx context.Context) error {
			if err := fx.Write(ctx, "failed"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Process(failing) = %v, want its error", err)
		}
		// WithTx joins without ending it, even when fn fails.
		if err := db.WithTx(jctx, func(_ context.Context, got *sql.Tx) error {
			if got != tx {
				t.Error("WithTx handed another transaction than the joined one")
			}
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("WithTx = %v", err)
		}
		if _, err := store.CompleteTx(jctx, idem.Ref{Scope: "s", Key: "k"}, func(context.Context) (idem.Response, bool, error) {
			t.Error("CompleteTx ran its work in a joined transaction")
			return idem.Response{}, false, nil
		}); !errors.Is(err, idempgsql.ErrNestedCompleteTx) {
			t.Fatalf("CompleteTx in a joined transaction = %v, want ErrNestedCompleteTx", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("the application's commit: %v", err)
		}
		if k, e, o := count(); k != 1 || e != 1 || o != 1 {
			t.Fatalf("after the commit: %d keys, %d effects, %d entries; want 1 each", k, e, o)
		}
		if n, err := fx.Count(ctx, "failed"); err != nil || n != 0 {
			t.Fatalf("the failed handler's write: %d, %v; want rolled back", n, err)
		}
		if err := inbox.Process(ctx, "c", "m2", func(ctx context.Context) error { return nil }); err != nil {
			t.Fatalf("the failed message's redelivery = %v, want it to run", err)
		}
	})
}

// Bad arguments are refused with idem.ErrInvalidArgument and change
// nothing.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store, inbox := newStore(t, db), newInbox(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		invalid := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Errorf("%s = %v, want an invalid argument", what, err)
			}
		}
		_, err = store.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "k\x00", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
		invalid("Claim with a NUL in the key", err)
		_, err = store.Purge(ctx, 0)
		invalid("Purge(0)", err)
		invalid("Process with no consumer", inbox.Process(ctx, "", "m", func(context.Context) error { return nil }))
		invalid("Process with an invalid key", inbox.Process(ctx, "c", "\xff", func(context.Context) error { return nil }))
		invalid("Add with one invalid message", outbox.Add(ctx,
			idem.Message{ID: "ok", Topic: "t"}, idem.Message{ID: "bad", Topic: "t\x00"}))
		_, err = outbox.Claim(ctx, "", 1, time.Second)
		invalid("Claim with no relay", err)
		var keys, rows, entries int
		if err := db.SQL().QueryRowContext(ctx, `SELECT
			(SELECT count(*) FROM idem_keys), (SELECT count(*) FROM idem_inbox), (SELECT count(*) FROM idem_outbox)`).
			Scan(&keys, &rows, &entries); err != nil {
			t.Fatal(err)
		}
		if keys+rows+entries != 0 {
			t.Errorf("%d keys, %d inbox rows, %d outbox entries after refused calls; want none", keys, rows, entries)
		}
	})
}
