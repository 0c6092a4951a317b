// This file tests the inbox, the store and CompleteTx at each isolation
// level, as they behave at it (the package documentation, "Isolation
// levels", says the same).

package idempgsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempgsql"
	"github.com/idem-go/idem/idemtest"
)

var levels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// eachLevel runs fn as a parallel subtest per isolation level.
func eachLevel(t *testing.T, fn func(t *testing.T, level sql.IsolationLevel)) {
	t.Helper()
	for _, l := range levels {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			fn(t, l)
		})
	}
}

// openNamedDB is openDB whose connections carry a random application_name,
// returned too, so that waitBlocked can find them in pg_stat_activity.
func openNamedDB(t *testing.T, driver string, cfg idempgsql.Config) (*idempgsql.DB, string) {
	t.Helper()
	name := randomName("idempgsql_")
	sqldb := openSQL(t, driver, "application_name="+name)
	db, err := idempgsql.NewDB(t.Context(), sqldb, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db, name
}

// waitBlocked waits until a connection named app waits for a lock.
func waitBlocked(t *testing.T, db *idempgsql.DB, app string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		var n int
		err := db.SQL().QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
		if err != nil {
			t.Fatalf("waiting for a connection to wait for a lock: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("no connection waited for a lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Two deliveries of one message at once, each in the inbox's own
// transaction at the level Config.TxOptions sets: the second waits for the
// first, and is a duplicate when the first commits (at every level: the
// inbox begins again when its snapshot was taken before the first
// committed), and runs when the first rolls back.
func TestIsolationInboxConcurrentDuplicate(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		eachLevel(t, func(t *testing.T, level sql.IsolationLevel) {
			ctx := t.Context()
			db, app := openNamedDB(t, driver, idempgsql.Config{TxOptions: &sql.TxOptions{Isolation: level}})
			inbox, fx := newInbox(t, db), newEffects(t, db)
			for _, firstFails := range []bool{false, true} {
				id := map[bool]string{false: "committed", true: "rolled-back"}[firstFails]
				started, proceed := make(chan struct{}), make(chan struct{})
				first := make(chan error, 1)
				go func() {
					first <- inbox.Process(ctx, "c", id, func(ctx context.Context) error {
						if err := fx.Write(ctx, id); err != nil {
							return err
						}
						close(started)
						<-proceed
						if firstFails {
							return errors.New("the first delivery failed")
						}
						return nil
					})
				}()
				<-started
				second := make(chan error, 1)
				ran := false
				go func() {
					second <- inbox.Process(ctx, "c", id, func(ctx context.Context) error {
						ran = true
						return fx.Write(ctx, id)
					})
				}()
				waitBlocked(t, db, app)
				close(proceed)
				if err := <-first; firstFails == (err == nil) {
					t.Fatalf("firstFails=%v: the first delivery = %v", firstFails, err)
				}
				err := <-second
				switch {
				case !firstFails && !errors.Is(err, idem.ErrDuplicate):
					t.Errorf("the second delivery, after the first committed = %v (SQLSTATE %q); want ErrDuplicate", err, sqlStateOf(err))
				case firstFails && (err != nil || !ran):
					t.Errorf("the second delivery, after the first rolled back = %v, ran %v; want it to run", err, ran)
				}
				if n, err := fx.Count(ctx, id); err != nil || n != 1 {
					t.Errorf("firstFails=%v: the effect committed %d times (%v), want once", firstFails, n, err)
				}
			}
		})
	})
}

// A delivery in the application's transaction, of a message another
// transaction recorded and committed after this one's snapshot: a
// duplicate at READ COMMITTED; at REPEATABLE READ and SERIALIZABLE the
// snapshot cannot see the row, and the inbox answers with the
// serialization failure (40001), transient, after which the application's
// transaction is still usable, and the delivery in a new transaction is a
// duplicate.
func TestIsolationInboxJoined(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		eachLevel(t, func(t *testing.T, level sql.IsolationLevel) {
			ctx := t.Context()
			db := openDB(t, driver, idempgsql.Config{})
			inbox, fx := newInbox(t, db), newEffects(t, db)
			tx := begin(t, db, &sql.TxOptions{Isolation: level})
			if _, err := tx.ExecContext(ctx, `SELECT 1 FROM effects`); err != nil { // takes the snapshot
				t.Fatal(err)
			}
			if err := inbox.Process(ctx, "c", "m", func(ctx context.Context) error { return fx.Write(ctx, "m") }); err != nil {
				t.Fatal(err)
			}
			jctx := db.JoinTx(ctx, tx)
			err := inbox.Process(jctx, "c", "m", func(ctx context.Context) error { return fx.Write(ctx, "m") })
			if level == sql.LevelReadCommitted {
				if !errors.Is(err, idem.ErrDuplicate) {
					t.Fatalf("Process = %v, want ErrDuplicate", err)
				}
			} else {
				if sqlStateOf(err) != "40001" {
					t.Fatalf("Process = %v, want a serialization failure", err)
				}
				if !transient(err) {
					t.Errorf("Classify(%v) = %v, want transient", err, classify(err))
				}
			}
			if err := fx.Write(jctx, "after"); err != nil {
				t.Fatalf("the application's write after Process: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("the application's commit: %v", err)
			}
			if n, err := fx.Count(ctx, "m"); err != nil || n != 1 {
				t.Errorf("the effect committed %d times (%v), want once", n, err)
			}
			tx = begin(t, db, &sql.TxOptions{Isolation: level})
			if err := inbox.Process(db.JoinTx(ctx, tx), "c", "m", func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
				t.Errorf("the delivery in a new transaction = %v, want ErrDuplicate", err)
			}
		})
	})
}

// A claim in the application's transaction of a key another transaction
// claimed and committed after this one's snapshot: InFlight at READ
// COMMITTED; a serialization failure at the stricter levels, after which
// the transaction is still usable.
func TestIsolationClaimJoined(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		eachLevel(t, func(t *testing.T, level sql.IsolationLevel) {
			ctx := t.Context()
			db := openDB(t, driver, idempgsql.Config{})
			store, fx := newStore(t, db), newEffects(t, db)
			req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
			tx := begin(t, db, &sql.TxOptions{Isolation: level})
			if _, err := tx.ExecContext(ctx, `SELECT 1 FROM effects`); err != nil {
				t.Fatal(err)
			}
			if c, err := store.Claim(ctx, req); err != nil || c.Outcome != idem.Acquired {
				t.Fatalf("the other claim = %v, %v", c.Outcome, err)
			}
			jctx := db.JoinTx(ctx, tx)
			c, err := store.Claim(jctx, req)
			if level == sql.LevelReadCommitted {
				if err != nil || c.Outcome != idem.InFlight {
					t.Fatalf("Claim = %v, %v; want InFlight", c.Outcome, err)
				}
			} else if sqlStateOf(err) != "40001" || !transient(err) {
				t.Fatalf("Claim = %v, %v; want a serialization failure, transient", c.Outcome, err)
			}
			if err := fx.Write(jctx, "after"); err != nil {
				t.Fatalf("the application's write after Claim: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("the application's commit: %v", err)
			}
		})
	})
}

// CompleteTx whose key another execution took over while the work ran
// returns ErrLeaseLost and keeps nothing, at every level of
// Config.TxOptions (at the stricter ones the completion fails with a
// serialization failure, and CompleteTx tells which it was).
func TestIsolationCompleteTxTakenOver(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		eachLevel(t, func(t *testing.T, level sql.IsolationLevel) {
			ctx, bg := t.Context(), t.Context()
			clock := idemmem.NewClock(idemtest.Start)
			db := openDB(t, driver, idempgsql.Config{Clock: clock, TxOptions: &sql.TxOptions{Isolation: level}})
			store, fx := newStore(t, db), newEffects(t, db)
			req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
			first, err := store.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			kept, err := store.CompleteTx(ctx, idem.Ref{Scope: "s", Key: "k", Token: first.Token}, func(ctx context.Context) (idem.Response, bool, error) {
				if err := fx.Write(ctx, "first"); err != nil {
					return idem.Response{}, false, err
				}
				clock.Advance(2 * time.Minute)
				// bg, not ctx: outside the work's transaction.
				if c, err := store.Claim(bg, req); err != nil || !c.TookOver {
					t.Errorf("the takeover = %+v, %v", c, err)
				}
				return idem.Response{Status: 201}, true, nil
			})
			if kept || !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("CompleteTx after a takeover = %v, %v; want ErrLeaseLost", kept, err)
			}
			if n, err := fx.Count(ctx, "first"); err != nil || n != 0 {
				t.Errorf("the work's write: %d, %v; want rolled back", n, err)
			}
		})
	})
}
