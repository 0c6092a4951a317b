package ormtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

// orm is what the suite needs of a library over database/sql.
type orm interface {
	name() string
	// inTx runs fn in a transaction the library begins itself, and
	// commits it when fn returns nil (rolls it back otherwise).
	inTx(ctx context.Context, fn func(w writer) error) error
	// on returns the library working in tx, a transaction idem began and
	// handed out (DB.WithTx).
	on(ctx context.Context, tx *sql.Tx) writer
}

// writer is the library in one transaction.
type writer interface {
	sqlTx() *sql.Tx
	// add runs addSQL; createOrder inserts an order, as the library
	// writes rows.
	add(ctx context.Context, amount int64) error
	createOrder(ctx context.Context, id, item string) error
	// nested runs fn in a nested transaction of the library's (a
	// savepoint), rolled back to when fn fails.
	nested(ctx context.Context, fn func(w writer) error) error
}

// runSuite runs the suite on each driver, with the library newORM makes.
func runSuite(t *testing.T, newORM func(t *testing.T, e *env) orm) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *env, o orm)
	}{
		{"Inbox", testInbox},
		{"InboxNested", testInboxNested},
		{"InboxInNestedTx", testInboxInNestedTx},
		{"Outbox", testOutbox},
		{"Middleware", testMiddleware},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachDriver(t, func(t *testing.T, driver string) {
				e := newEnv(t, driver)
				tc.run(t, e, newORM(t, e))
			})
		})
	}
}

// deliver delivers message id, whose handler adds amount to the total and
// then fails when fail is set, in a transaction of the library's own.
func deliver(e *env, o orm, id string, amount int64, fail bool) error {
	return o.inTx(e.ctx, func(w writer) error {
		ctx := e.db.JoinTx(e.ctx, w.sqlTx())
		return e.inbox.Process(ctx, "settlement", id, func(ctx context.Context) error {
			if err := w.add(ctx, amount); err != nil {
				return err
			}
			if fail {
				return errFail
			}
			return nil
		})
	})
}

// The inbox in the library's transactions: a message counts once, a
// failed one is rolled back with its row and runs again, and a duplicate
// leaves the library's transaction usable for the rest of its work.
func testInbox(t *testing.T, e *env, o orm) {
	if err := deliver(e, o, "e1", 100, false); err != nil {
		t.Fatal(err)
	}
	if err := deliver(e, o, "e1", 100, false); !errors.Is(err, idem.ErrDuplicate) {
		t.Fatalf("e1 again = %v, want ErrDuplicate", err)
	}
	if err := deliver(e, o, "e2", 50, true); !errors.Is(err, errFail) {
		t.Fatalf("e2 failing = %v, want its error", err)
	}
	if err := deliver(e, o, "e2", 50, false); err != nil {
		t.Fatalf("e2 again = %v, want it to run", err)
	}
	if got := e.total(); got != 150 {
		t.Errorf("total %d, want 150", got)
	}
	// A duplicate in a transaction that goes on.
	err := o.inTx(e.ctx, func(w writer) error {
		ctx := e.db.JoinTx(e.ctx, w.sqlTx())
		err := e.inbox.Process(ctx, "settlement", "e1", func(ctx context.Context) error { return w.add(ctx, 100) })
		if !errors.Is(err, idem.ErrDuplicate) {
			return fmt.Errorf("e1 in a transaction that goes on = %v, want ErrDuplicate", err)
		}
		return w.createOrder(ctx, "o-after-duplicate", "kept")
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.count("orders") != 1 || e.total() != 150 {
		t.Errorf("after a duplicate in a transaction that went on: %d orders, total %d; want 1, 150", e.count("orders"), e.total())
	}
}

// Nested inboxes in one transaction of the library's: a handler that
// processes a message whose handler fails, and then fails itself, keeps
// none of its writes, and both messages run again; when only the inner
// one fails, the outer one's writes commit. The library's transaction
// goes on after both, and commits its own writes.
func testInboxNested(t *testing.T, e *env, o orm) {
	for _, failOuter := range []bool{true, false} {
		a, b := fmt.Sprintf("a-%v", failOuter), fmt.Sprintf("b-%v", failOuter)
		before := e.total()
		err := o.inTx(e.ctx, func(w writer) error {
			ctx := e.db.JoinTx(e.ctx, w.sqlTx())
			err := e.inbox.Process(ctx, "settlement", a, func(ctx context.Context) error {
				if err := w.add(ctx, 100); err != nil {
					return err
				}
				err := e.inbox.Process(ctx, "settlement", b, func(ctx context.Context) error {
					if err := w.add(ctx, 7); err != nil {
						return err
					}
					return errFail
				})
				if !errors.Is(err, errFail) {
					return fmt.Errorf("the inner Process = %v, want its handler's error", err)
				}
				if failOuter {
					return errFail
				}
				return nil
			})
			if failOuter != errors.Is(err, errFail) || !failOuter && err != nil {
				return fmt.Errorf("the outer Process = %v", err)
			}
			return w.createOrder(ctx, "o-"+a, "after the inbox")
		})
		if err != nil {
			t.Fatalf("failOuter=%v: %v", failOuter, err)
		}
		want := before
		if !failOuter {
			want += 100
		}
		if got := e.total(); got != want {
			t.Errorf("failOuter=%v: total %d, want %d", failOuter, got, want)
		}
		if got := e.redelivered(a); got != failOuter {
			t.Errorf("failOuter=%v: the outer message runs again: %v", failOuter, got)
		}
		if !e.redelivered(b) {
			t.Errorf("failOuter=%v: the inner, failed message does not run again", failOuter)
		}
	}
	if n := e.count("orders"); n != 2 {
		t.Errorf("%d orders committed, want 2: the library's own writes after the inbox", n)
	}
}

// The inbox and the library's own nested transactions: a nested
// transaction inside a handler that fails takes only its own writes with
// it; a Process inside a nested transaction that the library rolls back is
// rolled back with it, row included, and its message runs again.
func testInboxInNestedTx(t *testing.T, e *env, o orm) {
	err := o.inTx(e.ctx, func(w writer) error {
		ctx := e.db.JoinTx(e.ctx, w.sqlTx())
		err := e.inbox.Process(ctx, "settlement", "e1", func(ctx context.Context) error {
			err := w.nested(ctx, func(w writer) error {
				if err := w.add(ctx, 5); err != nil {
					return err
				}
				return errFail
			})
			if !errors.Is(err, errFail) {
				return fmt.Errorf("the nested transaction = %v", err)
			}
			return w.add(ctx, 100)
		})
		if err != nil {
			return err
		}
		err = w.nested(ctx, func(w writer) error {
			// The same *sql.Tx: the context joined above carries it.
			if err := e.inbox.Process(ctx, "settlement", "e2", func(ctx context.Context) error { return w.add(ctx, 1000) }); err != nil {
				return err
			}
			return errFail
		})
		if !errors.Is(err, errFail) {
			return fmt.Errorf("the nested transaction around Process = %v", err)
		}
		return w.createOrder(ctx, "o-1", "kept")
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.total(); got != 100 {
		t.Errorf("total %d, want 100", got)
	}
	if e.redelivered("e1") {
		t.Error("e1 runs again, though its handler succeeded")
	}
	if !e.redelivered("e2") {
		t.Error("e2 does not run again, though the nested transaction around it rolled back")
	}
	if n := e.count("orders"); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// The outbox in the library's transactions: an entry commits with the
// order it announces, or goes with it; an Add inside a nested transaction
// the library rolls back goes with it; an Add that fails takes nothing of
// the library's with it, and the transaction commits the rest.
func testOutbox(t *testing.T, e *env, o orm) {
	e.failOn()
	place := func(id string, fail bool) error {
		return o.inTx(e.ctx, func(w writer) error {
			ctx := e.db.JoinTx(e.ctx, w.sqlTx())
			if err := w.createOrder(ctx, id, "teapot"); err != nil {
				return err
			}
			if err := e.outbox.Add(ctx, idem.Message{ID: "created-" + id, Topic: "orders"}); err != nil {
				return err
			}
			if fail {
				return errFail
			}
			return nil
		})
	}
	if err := place("o-1", false); err != nil {
		t.Fatal(err)
	}
	if err := place("o-2", true); !errors.Is(err, errFail) {
		t.Fatalf("a failing transaction = %v", err)
	}
	err := o.inTx(e.ctx, func(w writer) error {
		ctx := e.db.JoinTx(e.ctx, w.sqlTx())
		if err := w.createOrder(ctx, "o-3", "kettle"); err != nil {
			return err
		}
		err := w.nested(ctx, func(w writer) error {
			if err := e.outbox.Add(ctx, idem.Message{ID: "gift-o-3", Topic: "gifts"}); err != nil {
				return err
			}
			return errFail
		})
		if !errors.Is(err, errFail) {
			return fmt.Errorf("the nested transaction = %v", err)
		}
		// idem's own failure: a deadlock while adding; the transaction
		// goes on without the entry.
		err = e.outbox.Add(ctx, idem.Message{ID: "fails", Topic: "fail"})
		if err == nil {
			return errors.New("the failing Add succeeded")
		}
		return e.outbox.Add(ctx, idem.Message{ID: "created-o-3", Topic: "orders"})
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := e.sql.QueryContext(e.ctx, `SELECT id FROM idem_outbox ORDER BY seq`)
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
	if got := fmt.Sprint(ids); got != "[created-o-1 created-o-3]" {
		t.Errorf("entries %s, want [created-o-1 created-o-3]", got)
	}
	if n := e.count("orders"); n != 2 {
		t.Errorf("%d orders, want 2", n)
	}
}

// The middleware over a handler that writes through the library in the
// transaction that keeps its answer (DB.WithTx), with a nested transaction
// of the library's that fails and an outbox entry: a retry replays, the
// order and its entry are written once and the failed nested write not at
// all; a handler that fails the first time is rolled back, and its retry
// runs again.
func testMiddleware(t *testing.T, e *env, o orm) {
	var attempts atomic.Int64
	var flakyFailed atomic.Bool
	post := e.serve(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := string(body)
		attempts.Add(1)
		err := e.db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			lw := o.on(ctx, tx)
			if err := lw.createOrder(ctx, id, "teapot"); err != nil {
				return err
			}
			err := lw.nested(ctx, func(lw writer) error {
				if err := lw.createOrder(ctx, id+"-gift", "wrapping"); err != nil {
					return err
				}
				return errFail
			})
			if !errors.Is(err, errFail) {
				return fmt.Errorf("the nested transaction = %v", err)
			}
			return e.outbox.Add(ctx, idem.Message{ID: "created-" + id, Topic: "orders"})
		})
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case id == "o-flaky" && !flakyFailed.Swap(true):
			http.Error(w, "the card network timed out", http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "order %s", id)
		}
	})
	for i, want := range []bool{false, true} {
		status, body, replayed := post("key-1", "o-1")
		if status != http.StatusCreated || body != "order o-1" || replayed != want {
			t.Fatalf("attempt %d: %d %q replayed=%v", i+1, status, body, replayed)
		}
	}
	if status, _, _ := post("key-2", "o-flaky"); status != http.StatusServiceUnavailable {
		t.Fatalf("the flaky order's first attempt: %d, want 503", status)
	}
	if n := e.count("orders"); n != 1 {
		t.Fatalf("%d orders after the failed attempt, want 1: its write rolled back", n)
	}
	if status, body, replayed := post("key-2", "o-flaky"); status != http.StatusCreated || replayed {
		t.Fatalf("the flaky order's retry: %d %q replayed=%v, want it run again", status, body, replayed)
	}
	if n, m := e.count("orders"), e.count("idem_outbox"); n != 2 || m != 2 {
		t.Errorf("%d orders and %d entries, want 2 and 2", n, m)
	}
	if n := attempts.Load(); n != 3 {
		t.Errorf("the handler ran %d times, want 3", n)
	}
}
