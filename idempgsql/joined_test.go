// This file holds the tests of idem's calls inside a transaction that is
// not their own: nested inboxes, several DBs on one *sql.DB, goroutines
// sharing a transaction, claims that must not hold a key's lock, and idem's
// own failures, which must leave the application's transaction usable.

package idempgsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgsql"
)

// sqlStateOf is the SQLSTATE of err as either driver reports it, or "".
func sqlStateOf(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// begin begins a transaction of the application's on db's *sql.DB and
// rolls it back when the test ends, if it has not ended.
func begin(t *testing.T, db *idempgsql.DB, opts *sql.TxOptions) *sql.Tx {
	t.Helper()
	tx, err := db.SQL().BeginTx(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

// An inbox's handler that calls Process for another message, whose handler
// fails, and then fails itself, rolls back exactly its own writes: both
// messages' rows and effects are gone, and both are redelivered. When only
// the inner one fails, the outer one's writes commit and the inner one's
// do not; when only the outer one fails, the inner one's go with it. The
// same holds in the application's transaction (JoinTx) and in the inbox's
// own.
func TestNestedProcess(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		inbox, fx := newInbox(t, db), newEffects(t, db)
		errA, errB := errors.New("A failed"), errors.New("B failed")
		for _, joined := range []bool{true, false} {
			for _, c := range []struct{ failA, failB bool }{{true, true}, {false, true}, {true, false}, {false, false}} {
				name := fmt.Sprintf("joined=%v,failA=%v,failB=%v", joined, c.failA, c.failB)
				a, b := "A-"+name, "B-"+name
				pctx := ctx
				var tx *sql.Tx
				if joined {
					tx = begin(t, db, nil)
					pctx = db.JoinTx(ctx, tx)
				}
				err := inbox.Process(pctx, "c", a, func(ctx context.Context) error {
					if err := fx.Write(ctx, a); err != nil {
						return err
					}
					err := inbox.Process(ctx, "c", b, func(ctx context.Context) error {
						if err := fx.Write(ctx, b); err != nil {
							return err
						}
						if c.failB {
							return errB
						}
						return nil
					})
					if c.failB != errors.Is(err, errB) || !c.failB && err != nil {
						t.Errorf("%s: the inner Process = %v", name, err)
					}
					if c.failA {
						return errA
					}
					return nil
				})
				if c.failA != errors.Is(err, errA) || !c.failA && err != nil {
					t.Fatalf("%s: Process = %v", name, err)
				}
				if joined {
					if err := tx.Commit(); err != nil {
						t.Fatalf("%s: the application's commit: %v", name, err)
					}
				}
				wantA, wantB := !c.failA, !c.failA && !c.failB
				for _, m := range []struct {
					id   string
					want bool
				}{{a, wantA}, {b, wantB}} {
					if n, err := fx.Count(ctx, m.id); err != nil || (n == 1) != m.want || n > 1 {
						t.Errorf("%s: %s's effect committed %d times (%v), want %v", name, m.id, n, err, m.want)
					}
					err := inbox.Process(ctx, "c", m.id, func(context.Context) error { return nil })
					if m.want != errors.Is(err, idem.ErrDuplicate) || !m.want && err != nil {
						t.Errorf("%s: %s's redelivery = %v; want a duplicate: %v", name, m.id, err, m.want)
					}
				}
			}
		}
	})
}

// Two DBs made on one *sql.DB see each other's transactions: an outbox
// entry added through the second with the context of the first's JoinTx
// rolls back with the application's transaction, an inbox row recorded
// through the second in the first's WithTx commits with it, and the
// second's CompleteTx refuses the first's transaction instead of opening a
// connection of its own beside it.
func TestTwoDBsOnOneSQLDB(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		sqldb := openSQL(t, driver)
		db1, err := idempgsql.NewDB(ctx, sqldb, nil)
		if err != nil {
			t.Fatal(err)
		}
		db2, err := idempgsql.NewDB(ctx, sqldb, nil)
		if err != nil {
			t.Fatal(err)
		}
		outbox2, err := idempgsql.NewOutbox(ctx, db2, nil)
		if err != nil {
			t.Fatal(err)
		}
		store2, inbox2, fx := newStore(t, db2), newInbox(t, db2), newEffects(t, db1)

		tx := begin(t, db1, nil)
		jctx := db1.JoinTx(ctx, tx)
		if err := outbox2.Add(jctx, idem.Message{ID: "e1", Topic: "t", Payload: []byte("p")}); err != nil {
			t.Fatal(err)
		}
		if _, err := store2.CompleteTx(jctx, idem.Ref{Scope: "s", Key: "k", Token: 1}, func(context.Context) (idem.Response, bool, error) {
			t.Error("CompleteTx ran its work beside the application's transaction")
			return idem.Response{}, false, nil
		}); !errors.Is(err, idempgsql.ErrNestedCompleteTx) {
			t.Errorf("CompleteTx through another DB on the same *sql.DB = %v, want ErrNestedCompleteTx", err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		var entries int
		if err := sqldb.QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&entries); err != nil {
			t.Fatal(err)
		}
		if entries != 0 {
			t.Errorf("%d outbox entries after the application rolled back, want none", entries)
		}

		err = db1.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
			if err := inbox2.Process(ctx, "c", "m1", func(ctx context.Context) error { return fx.Write(ctx, "m1") }); err != nil {
				return err
			}
			return errors.New("rolled back")
		})
		if err == nil {
			t.Fatal("WithTx succeeded")
		}
		if n, err := fx.Count(ctx, "m1"); err != nil || n != 0 {
			t.Errorf("the inbox's effect: %d, %v after the transaction rolled back; want none", n, err)
		}
		if err := inbox2.Process(ctx, "c", "m1", func(context.Context) error { return nil }); err != nil {
			t.Errorf("m1's redelivery = %v; want it to run: its row rolled back", err)
		}
	})
}

// A handler of Process running in one goroutine and a Process of another
// message from another goroutine, both in one transaction: the second must
// not report success for an effect that the first's failure then rolls
// back.
func TestProcessFromAnotherGoroutine(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		inbox, fx := newInbox(t, db), newEffects(t, db)
		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		started, proceed := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- inbox.Process(jctx, "c", "m1", func(ctx context.Context) error {
				if err := fx.Write(ctx, "m1"); err != nil {
					return err
				}
				close(started)
				<-proceed
				return errors.New("m1 failed")
			})
		}()
		<-started
		second := inbox.Process(jctx, "c", "m2", func(ctx context.Context) error { return fx.Write(ctx, "m2") })
		close(proceed)
		if err := <-first; err == nil {
			t.Fatal("the failing handler's Process succeeded")
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("the application's commit: %v", err)
		}
		n, err := fx.Count(ctx, "m2")
		if err != nil {
			t.Fatal(err)
		}
		if second == nil && n != 1 {
			t.Errorf("the second goroutine's Process succeeded, but its effect committed %d times: the message is lost", n)
		}
		if !errors.Is(second, idempgsql.ErrTxBusy) {
			t.Errorf("the second goroutine's Process = %v, want ErrTxBusy", second)
		}
		if err := inbox.Process(ctx, "c", "m2", func(context.Context) error { return nil }); err != nil {
			t.Errorf("m2's redelivery = %v; want it to run", err)
		}
	})
}

// While a handler runs in a transaction, idem's calls in the same
// transaction from outside it (another goroutine, or the handler itself
// with a context from outside it) are refused with ErrTxBusy, having done
// nothing, and so is joining it with WithTx; the handler's own context
// works. A handler's context used after its Process returned is refused
// too.
func TestTxBusy(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		inbox, store, fx := newInbox(t, db), newStore(t, db), newEffects(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		started, proceed := make(chan struct{}), make(chan struct{})
		var handlerCtx context.Context
		handler := make(chan error, 1)
		go func() {
			handler <- inbox.Process(jctx, "c", "m1", func(ctx context.Context) error {
				handlerCtx = ctx
				// The handler itself, with the context from outside it.
				if err := outbox.Add(jctx, idem.Message{ID: "outer", Topic: "t"}); !errors.Is(err, idempgsql.ErrTxBusy) {
					t.Errorf("Add with a context from outside the handler = %v, want ErrTxBusy", err)
				}
				if err := outbox.Add(ctx, idem.Message{ID: "inner", Topic: "t"}); err != nil {
					t.Errorf("Add with the handler's context = %v", err)
				}
				close(started)
				<-proceed
				return fx.Write(ctx, "m1")
			})
		}()
		<-started
		busy := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, idempgsql.ErrTxBusy) {
				t.Errorf("%s from another goroutine while a handler runs = %v, want ErrTxBusy", what, err)
			}
		}
		busy("Add", outbox.Add(jctx, idem.Message{ID: "other", Topic: "t"}))
		_, err = store.Claim(jctx, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
		busy("Claim", err)
		busy("Process", inbox.Process(jctx, "c", "m2", func(context.Context) error { return nil }))
		busy("WithTx", db.WithTx(jctx, func(context.Context, *sql.Tx) error { return nil }))
		close(proceed)
		if err := <-handler; err != nil {
			t.Fatal(err)
		}
		if err := outbox.Add(handlerCtx, idem.Message{ID: "late", Topic: "t"}); !errors.Is(err, sql.ErrTxDone) {
			t.Errorf("Add with the context of a handler that returned = %v, want sql.ErrTxDone", err)
		}
		// Free again.
		if err := outbox.Add(jctx, idem.Message{ID: "after", Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		rows, err := db.SQL().QueryContext(ctx, `SELECT id FROM idem_outbox ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if fmt.Sprint(ids) != "[inner after]" {
			t.Errorf("entries committed: %v, want [inner after]", ids)
		}
	})
}

// idem's calls in one transaction from several goroutines at once, none of
// them running a handler, are serialised: each runs in a savepoint of its
// own, and one that fails undoes its own writes only.
func TestConcurrentCallsInOneTx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store := newStore(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		failOn(t, db)
		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		const goroutines, calls = 6, 15
		errs := make(chan error, goroutines)
		for g := range goroutines {
			go func() {
				for i := range calls {
					topic := "t"
					if g == 0 && i%3 == 0 {
						topic = "fail-40P01" // fails, and must take nothing else with it
					}
					err := outbox.Add(jctx, idem.Message{ID: fmt.Sprintf("%d-%d-a", g, i), Topic: topic},
						idem.Message{ID: fmt.Sprintf("%d-%d-b", g, i), Topic: topic})
					if (topic != "t") != (err != nil) {
						errs <- fmt.Errorf("Add(%s) = %v", topic, err)
						return
					}
					c, err := store.Claim(jctx, idem.ClaimRequest{Scope: "s", Key: idem.Key(fmt.Sprintf("%d-%d", g, i)),
						Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
					if err != nil || c.Outcome != idem.Acquired {
						errs <- fmt.Errorf("Claim = %v, %v", c.Outcome, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for range goroutines {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("the application's commit: %v", err)
		}
		var entries, keys int
		if err := db.SQL().QueryRowContext(ctx, `SELECT (SELECT count(*) FROM idem_outbox), (SELECT count(*) FROM idem_keys)`).
			Scan(&entries, &keys); err != nil {
			t.Fatal(err)
		}
		if want := 2 * (goroutines*calls - 5); entries != want || keys != goroutines*calls {
			t.Errorf("%d entries and %d keys committed, want %d and %d", entries, keys, want, goroutines*calls)
		}
	})
}

// A claim in the application's transaction holds no lock on a key it does
// not acquire: a replay of a completed key leaves the key free for other
// claims while that transaction runs, and two transactions claiming two
// keys in opposite orders do not deadlock.
func TestJoinedClaimLocks(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store := newStore(t, db)
		req := func(key string) idem.ClaimRequest {
			return idem.ClaimRequest{Scope: "s", Key: idem.Key(key), Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
		}
		done, err := store.Claim(ctx, req("done"))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, idem.Ref{Scope: "s", Key: "done", Token: done.Token}, idem.Response{Status: 201}); err != nil {
			t.Fatal(err)
		}

		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		if c, err := store.Claim(jctx, req("done")); err != nil || c.Outcome != idem.Completed {
			t.Fatalf("the replay in a transaction = %v, %v", c.Outcome, err)
		}
		// Bounded so that, on a store that keeps the key locked, the test
		// fails instead of waiting for the transaction.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := store.Claim(wctx, req("done"))
		cancel()
		if err != nil || c.Outcome != idem.Completed {
			t.Errorf("a claim of the replayed key while the replaying transaction is open = %v, %v; want Completed at once", c.Outcome, err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}

		tx1, tx2 := begin(t, db, nil), begin(t, db, nil)
		ctx1, ctx2 := db.JoinTx(ctx, tx1), db.JoinTx(ctx, tx2)
		if c, err := store.Claim(ctx1, req("k1")); err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("T1 claims k1 = %v, %v", c.Outcome, err)
		}
		if c, err := store.Claim(ctx2, req("k2")); err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("T2 claims k2 = %v, %v", c.Outcome, err)
		}
		type result struct {
			c   idem.Claim
			err error
		}
		crossed := make(chan result, 2)
		for _, x := range []struct {
			ctx context.Context
			key string
		}{{ctx1, "k2"}, {ctx2, "k1"}} {
			go func() {
				cctx, cancel := context.WithTimeout(x.ctx, 5*time.Second)
				defer cancel()
				c, err := store.Claim(cctx, req(x.key))
				crossed <- result{c, err}
			}()
		}
		for range 2 {
			r := <-crossed
			if r.err != nil || r.c.Outcome != idem.InFlight {
				t.Errorf("a claim of the key the other transaction holds = %v, %v; want InFlight, no deadlock", r.c.Outcome, r.err)
			}
		}
		if err := tx1.Commit(); err != nil {
			t.Errorf("T1's commit: %v", err)
		}
		if err := tx2.Commit(); err != nil {
			t.Errorf("T2's commit: %v", err)
		}
	})
}

// failOn makes the inserts into idem_outbox of a message whose topic names
// a SQLSTATE ("fail-40001") fail with it, those whose topic names an
// advisory lock ("slow-42") wait for it, and the completions of a key with status 599 fail
// with a serialization failure: a failure of idem's own statement, in the
// middle of the application's transaction.
func failOn(t *testing.T, db *idempgsql.DB) {
	t.Helper()
	_, err := db.SQL().ExecContext(t.Context(), `
CREATE FUNCTION test_fail_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.topic LIKE 'fail-%' THEN
		RAISE EXCEPTION 'the test fails this insert' USING ERRCODE = substr(NEW.topic, 6);
	END IF;
	IF NEW.topic LIKE 'slow-%' THEN
		PERFORM pg_advisory_xact_lock(substr(NEW.topic, 6)::bigint);
	END IF;
	RETURN NEW;
END $$;
CREATE FUNCTION test_fail_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.status = 599 THEN
		RAISE EXCEPTION 'the test fails this completion' USING ERRCODE = '40001';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER test_fail BEFORE INSERT ON idem_outbox FOR EACH ROW EXECUTE FUNCTION test_fail_outbox();
CREATE TRIGGER test_fail BEFORE UPDATE ON idem_keys FOR EACH ROW EXECUTE FUNCTION test_fail_keys();`)
	if err != nil {
		t.Fatal(err)
	}
}

// A failure of idem's own statement in the application's transaction rolls
// back what that call wrote, and only that: the application's transaction
// goes on and commits its own writes.
func TestIdemFailureLeavesTxUsable(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store, fx := newStore(t, db), newEffects(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		failOn(t, db)
		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		if err := fx.Write(jctx, "before"); err != nil {
			t.Fatal(err)
		}
		// The first message is written, the second fails: neither stays.
		err = outbox.Add(jctx, idem.Message{ID: "ok", Topic: "t"}, idem.Message{ID: "bad", Topic: "fail-40001"})
		if sqlStateOf(err) != "40001" {
			t.Fatalf("Add = %v, want the serialization failure", err)
		}
		c, err := store.Claim(jctx, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
		if err != nil {
			t.Fatalf("a claim after idem's failure, in the same transaction: %v", err)
		}
		err = store.Complete(jctx, idem.Ref{Scope: "s", Key: "k", Token: c.Token}, idem.Response{Status: 599})
		if sqlStateOf(err) != "40001" {
			t.Fatalf("Complete = %v, want the serialization failure", err)
		}
		if err := fx.Write(jctx, "after"); err != nil {
			t.Fatalf("the application's write after idem's failures: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("the application's commit after idem's failures: %v", err)
		}
		for _, tag := range []string{"before", "after"} {
			if n, err := fx.Count(ctx, tag); err != nil || n != 1 {
				t.Errorf("the application's write %q: %d, %v; want committed", tag, n, err)
			}
		}
		var entries int
		if err := db.SQL().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&entries); err != nil {
			t.Fatal(err)
		}
		if entries != 0 {
			t.Errorf("%d outbox entries of the failed Add committed, want none", entries)
		}
		rec, err := store.Get(ctx, "s", "k")
		if err != nil || rec.State != idem.StateInFlight || rec.Token != c.Token {
			t.Errorf("the key after its failed completion = %+v, %v; want the claim committed, in flight", rec, err)
		}
	})
}

// A handler that returns while a call it started with its context in
// another goroutine is still running: Process waits for that call, which
// ends inside the handler's savepoint, before it ends the savepoint; the
// transaction is then free for the next call.
func TestHandlerLeavesCallRunning(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db, app := openNamedDB(t, driver, idempgsql.Config{})
		inbox, _ := newInbox(t, db), newStore(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		failOn(t, db)
		lock := time.Now().UnixNano() // an advisory lock no other test takes
		holder, err := db.SQL().Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, lock); err != nil {
			t.Fatal(err)
		}
		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		left := make(chan error, 1)
		err = inbox.Process(jctx, "c", "m", func(ctx context.Context) error {
			go func() { left <- outbox.Add(ctx, idem.Message{ID: "slow", Topic: fmt.Sprintf("slow-%d", lock)}) }()
			waitBlocked(t, db, app)
			if _, err := holder.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lock); err != nil {
				t.Error(err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Process = %v", err)
		}
		if err := <-left; err != nil {
			t.Fatalf("the Add the handler left running = %v", err)
		}
		if err := outbox.Add(jctx, idem.Message{ID: "after", Topic: "t"}); err != nil {
			t.Fatalf("an Add after the handler's = %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		var entries int
		if err := db.SQL().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&entries); err != nil {
			t.Fatal(err)
		}
		if entries != 2 {
			t.Errorf("%d entries, want 2", entries)
		}
	})
}

// A DB on another *sql.DB whose connections reach the same schema (here
// with the other driver) joins the transaction too; one on another schema
// leaves it alone, and its Add commits on its own, in its own tables.
func TestTwoSQLDBs(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db1 := openDB(t, driver, idempgsql.Config{})
		other := map[string]string{"pgx": "postgres", "postgres": "pgx"}[driver]
		same, err := sql.Open(other, withParam(pgURL(t), "search_path="+db1.Schema()))
		if err != nil {
			t.Fatal(err)
		}
		defer same.Close()
		db2, err := idempgsql.NewDB(ctx, same, nil)
		if err != nil {
			t.Fatal(err)
		}
		elsewhere := openDB(t, other, idempgsql.Config{})
		outbox2, err := idempgsql.NewOutbox(ctx, db2, nil)
		if err != nil {
			t.Fatal(err)
		}
		outbox3, err := idempgsql.NewOutbox(ctx, elsewhere, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx := begin(t, db1, nil)
		jctx := db1.JoinTx(ctx, tx)
		if err := outbox2.Add(jctx, idem.Message{ID: "joined", Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := outbox3.Add(jctx, idem.Message{ID: "own", Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		var here, there int
		if err := db1.SQL().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&here); err != nil {
			t.Fatal(err)
		}
		if err := elsewhere.SQL().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&there); err != nil {
			t.Fatal(err)
		}
		if here != 0 || there != 1 {
			t.Errorf("%d entries in the joined schema (want 0: rolled back), %d in the other (want 1: its own)", here, there)
		}
	})
}

// A call of idem's in the application's transaction with a context that
// has ended sends nothing, and says so: its error is the context's, never
// ErrTxAborted (which tells the application to roll its transaction back),
// and the transaction goes on.
func TestEndedContextLeavesTxUsable(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		store, inbox, fx := newStore(t, db), newInbox(t, db), newEffects(t, db)
		outbox, err := idempgsql.NewOutbox(ctx, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx := begin(t, db, nil)
		jctx := db.JoinTx(ctx, tx)
		if err := fx.Write(jctx, "before"); err != nil {
			t.Fatal(err)
		}
		c, err := store.Claim(jctx, keyReq("k"))
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("Claim = %v, %v", c.Outcome, err)
		}
		ref := idem.Ref{Scope: "s", Key: "k", Token: c.Token}
		ended, cancel := context.WithCancel(jctx)
		cancel()
		for name, call := range map[string]func(ctx context.Context) error{
			"Claim":        func(ctx context.Context) error { _, err := store.Claim(ctx, keyReq("k2")); return err },
			"Complete":     func(ctx context.Context) error { return store.Complete(ctx, ref, idem.Response{Status: 201}) },
			"Release":      func(ctx context.Context) error { return store.Release(ctx, ref) },
			"Renew":        func(ctx context.Context) error { _, err := store.Renew(ctx, ref, time.Minute); return err },
			"Get":          func(ctx context.Context) error { _, err := store.Get(ctx, "s", "k"); return err },
			"Purge":        func(ctx context.Context) error { _, err := store.Purge(ctx, 10); return err },
			"Yield":        func(ctx context.Context) error { return store.Yield(ctx, ref) },
			"SaveRecovery": func(ctx context.Context) error { return store.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: "p"}) },
			"Abandoned":    func(ctx context.Context) error { _, err := store.Abandoned(ctx, 10); return err },
			"Outbox.Add":   func(ctx context.Context) error { return outbox.Add(ctx, idem.Message{ID: "m", Topic: "t"}) },
			"Outbox.Claim": func(ctx context.Context) error { _, err := outbox.Claim(ctx, "r", 10, time.Minute); return err },
			"Outbox.Mark":  func(ctx context.Context) error { return outbox.MarkSent(ctx, 1) },
			"Inbox.Process": func(ctx context.Context) error {
				return inbox.Process(ctx, "c", "m", func(context.Context) error { return nil })
			},
			"Inbox.Purge": func(ctx context.Context) error { _, err := inbox.PurgeInbox(ctx, time.Now(), 10); return err },
		} {
			err := call(ended)
			if !errors.Is(err, context.Canceled) || errors.Is(err, idempgsql.ErrTxAborted) {
				t.Errorf("%s with a context that has ended = %v; want the context's error, not ErrTxAborted", name, err)
			}
		}
		if err := fx.Write(jctx, "after"); err != nil {
			t.Fatalf("the application's write after the calls: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("the application's commit: %v", err)
		}
		for _, tag := range []string{"before", "after"} {
			if n, err := fx.Count(ctx, tag); err != nil || n != 1 {
				t.Errorf("the application's write %q: %d, %v; want committed", tag, n, err)
			}
		}
		if rec, err := store.Get(ctx, "s", "k"); err != nil || rec.State != idem.StateInFlight || rec.Token != c.Token {
			t.Errorf("the key = %+v, %v; want the claim committed, in flight, untouched", rec, err)
		}
	})
}

// A work that returns while a Process it started with its context in
// another goroutine is still running its handler: CompleteTx waits for
// that Process to end, inside the transaction, before it completes the key
// and commits. Committed under it, the handler's first writes and its
// message's row would be kept while its later calls failed (the
// transaction gone), and the redelivery of a message whose handler never
// finished would be a duplicate: what the handler had still to write (its
// outbox entry here) lost. WithTx and Process, which commit their own
// transactions too, wait alike. (Not parallel: it sets the package's hook.)
func TestCommitWaitsForCallsLeftRunning(t *testing.T) {
	pgURL(t)
	for _, driver := range drivers {
		for _, owner := range []string{"CompleteTx", "WithTx", "Process"} {
			t.Run(driver+"/"+owner, func(t *testing.T) {
				ctx := t.Context()
				db := openDB(t, driver, idempgsql.Config{})
				store, inbox, fx := newStore(t, db), newInbox(t, db), newEffects(t, db)
				outbox, err := idempgsql.NewOutbox(ctx, db, nil)
				if err != nil {
					t.Fatal(err)
				}
				blocked := make(chan struct{}, 1)
				restore := idempgsql.SetBlockedHook(func() {
					select {
					case blocked <- struct{}{}:
					default:
					}
				})
				defer restore()
				c, err := store.Claim(ctx, keyReq("k"))
				if err != nil {
					t.Fatal(err)
				}
				ref := idem.Ref{Scope: "s", Key: "k", Token: c.Token}

				started, proceed := make(chan struct{}), make(chan struct{})
				left := make(chan error, 1)
				// work starts the Process and returns once its handler runs.
				work := func(ctx context.Context) {
					go func() {
						left <- inbox.Process(ctx, "c", "m", func(ctx context.Context) error {
							if err := fx.Write(ctx, "m"); err != nil {
								return err
							}
							close(started)
							<-proceed
							return outbox.Add(ctx, idem.Message{ID: "m-done", Topic: "t"})
						})
					}()
					<-started
				}
				owned := make(chan error, 1)
				go func() {
					switch owner {
					case "CompleteTx":
						kept, err := store.CompleteTx(ctx, ref, func(ctx context.Context) (idem.Response, bool, error) {
							work(ctx)
							return idem.Response{Status: 201}, true, nil
						})
						if err == nil && !kept {
							err = errors.New("not kept")
						}
						owned <- err
					case "WithTx":
						owned <- db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
							work(ctx)
							return nil
						})
					case "Process":
						owned <- inbox.Process(ctx, "c", "owner", func(ctx context.Context) error {
							work(ctx)
							return nil
						})
					}
				}()
				select {
				case err := <-owned:
					t.Errorf("%s returned (%v) while a Process its code left running was in its handler", owner, err)
					close(proceed)
					<-left
				case <-blocked:
					close(proceed)
					if err := <-left; err != nil {
						t.Errorf("the Process left running = %v", err)
					}
					if err := <-owned; err != nil {
						t.Errorf("%s = %v", owner, err)
					}
				}
				var entries int
				if err := db.SQL().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox WHERE id = 'm-done'`).Scan(&entries); err != nil {
					t.Fatal(err)
				}
				n, err := fx.Count(ctx, "m")
				if err != nil {
					t.Fatal(err)
				}
				redelivery := inbox.Process(ctx, "c", "m", func(context.Context) error { return nil })
				if n != 1 || entries != 1 || !errors.Is(redelivery, idem.ErrDuplicate) {
					t.Errorf("the handler's effect %d, its outbox entry %d, its redelivery %v; want 1, 1, a duplicate", n, entries, redelivery)
				}
			})
		}
	}
}
