package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func TestWithTx(t *testing.T) {
	t.Parallel()
	errFail := errors.New("business rule failed")
	cases := []struct {
		name    string
		fn      func(db *idemsqlite.DB, ctx context.Context, tx *sql.Tx) error
		wantErr error
		want    []string
	}{
		{
			name: "commits",
			fn: func(db *idemsqlite.DB, ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1)`)
				return err
			},
			want: []string{"a"},
		},
		{
			name: "rolls back on error",
			fn: func(db *idemsqlite.DB, ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1)`); err != nil {
					return err
				}
				return errFail
			},
			wantErr: errFail,
		},
		{
			name: "nested calls join",
			fn: func(db *idemsqlite.DB, ctx context.Context, outer *sql.Tx) error {
				if _, err := outer.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1)`); err != nil {
					return err
				}
				return db.WithTx(ctx, func(ctx context.Context, inner *sql.Tx) error {
					if inner != outer {
						return errors.New("the nested WithTx got another transaction")
					}
					return insertPayment(ctx, db, "b")
				})
			},
			want: []string{"a", "b"},
		},
		{
			name: "nested writes roll back with the outer transaction",
			fn: func(db *idemsqlite.DB, ctx context.Context, tx *sql.Tx) error {
				if err := insertPayment(ctx, db, "a"); err != nil {
					return err
				}
				if err := insertPayment(ctx, db, "b"); err != nil {
					return err
				}
				return errFail
			},
			wantErr: errFail,
		},
		{
			name: "a nested error returned up rolls everything back",
			fn: func(db *idemsqlite.DB, ctx context.Context, tx *sql.Tx) error {
				if err := insertPayment(ctx, db, "a"); err != nil {
					return err
				}
				// The second insert breaks the primary key.
				return insertPayment(ctx, db, "a")
			},
			wantErr: errAny,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			migratePayments(t, db)
			err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
				return tc.fn(db, ctx, tx)
			})
			switch {
			case tc.wantErr == errAny && err == nil:
				t.Errorf("WithTx = nil, want an error")
			case tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Errorf("WithTx = %v, want %v", err, tc.wantErr)
			}
			if got := payments(t, db); !slices.Equal(got, tc.want) {
				t.Errorf("committed payments = %v, want %v", got, tc.want)
			}
		})
	}
}

// errAny stands for "some error" in the table above.
var errAny = errors.New("any error")

func TestWithTxPanic(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	ctx := t.Context()
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic of fn", p)
			}
		}()
		_ = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if err := insertPayment(ctx, db, "a"); err != nil {
				t.Error(err)
			}
			panic("boom")
		})
	}()
	if got := payments(t, db); len(got) != 0 {
		t.Errorf("payments after a panic = %v, want none", got)
	}
	// The writer connection came back: a new transaction can begin.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := insertPayment(wctx, db, "b"); err != nil {
		t.Fatalf("write after a panic: %v", err)
	}
}

func TestWithTxContextOutlivesTransaction(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	var kept context.Context
	if err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
		kept = ctx
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := insertPayment(kept, db, "late"); !errors.Is(err, sql.ErrTxDone) {
		t.Errorf("WithTx with the context of an ended transaction = %v, want sql.ErrTxDone", err)
	}
	if got := payments(t, db); len(got) != 0 {
		t.Errorf("payments = %v, want none", got)
	}
}

// A transaction of one DB does not capture WithTx calls on another.
func TestWithTxOtherDB(t *testing.T) {
	t.Parallel()
	db1, db2 := openDB(t), openDB(t)
	migratePayments(t, db1)
	migratePayments(t, db2)
	errFail := errors.New("fail")
	// Bounded, so that a nested call that missed db1's transaction and
	// queued for db1's writer fails instead of hanging.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := db1.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := insertPayment(ctx, db1, "one"); err != nil {
			return err
		}
		// db2's transaction nests in db1's, and db1's is still reachable
		// from inside it.
		err := db2.WithTx(ctx, func(ctx context.Context, tx2 *sql.Tx) error {
			if _, err := tx2.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ('two', 1)`); err != nil {
				return err
			}
			return db1.WithTx(ctx, func(ctx context.Context, inner *sql.Tx) error {
				if inner != tx {
					return errors.New("db1's transaction was not joined from inside db2's")
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		return errFail
	})
	if !errors.Is(err, errFail) {
		t.Fatalf("WithTx = %v", err)
	}
	if got := payments(t, db1); len(got) != 0 {
		t.Errorf("db1 payments = %v, want none (rolled back)", got)
	}
	if got := payments(t, db2); !slices.Equal(got, []string{"two"}) {
		t.Errorf("db2 payments = %v, want [two] (its own transaction committed)", got)
	}
}

// Store methods called with a context carrying a transaction join it: the
// claim commits or rolls back with the caller's writes, and Get in the
// transaction sees it.
func TestStoreJoinsCallerTransaction(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	s := newStore(t, db, idemtest.NewClock(idemtest.Start))
	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	errFail := errors.New("fail")

	for _, commit := range []bool{false, true} {
		err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
			c, err := s.Claim(ctx, req)
			if err != nil || c.Outcome != idem.Acquired {
				t.Fatalf("Claim in a transaction = %v, %v", c.Outcome, err)
			}
			if r, err := s.Get(ctx, req.Scope, req.Key); err != nil || r.Token != c.Token {
				t.Errorf("Get in the transaction = %+v, %v; want the uncommitted claim", r, err)
			}
			if err := insertPayment(ctx, db, "p"); err != nil {
				return err
			}
			if !commit {
				return errFail
			}
			return s.Complete(ctx, idem.Ref{Key: req.Key, Token: c.Token}, idem.Response{Status: 201})
		})
		if commit != (err == nil) {
			t.Fatalf("commit=%v: WithTx = %v", commit, err)
		}
		r, err := s.Get(t.Context(), req.Scope, req.Key)
		switch {
		case !commit && !errors.Is(err, idem.ErrNotFound):
			t.Errorf("after rollback, Get = %+v, %v; want ErrNotFound", r, err)
		case commit && (err != nil || r.State != idem.StateCompleted):
			t.Errorf("after commit, Get = %+v, %v; want completed", r, err)
		}
		if got, want := len(payments(t, db)), map[bool]int{false: 0, true: 1}[commit]; got != want {
			t.Errorf("commit=%v: %d payments, want %d", commit, got, want)
		}
	}
}
