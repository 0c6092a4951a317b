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
	"github.com/idem-go/idem/idemtest"
)

// errAny stands for "some error" in the tables below.
var errAny = errors.New("any error")

func TestWithTx(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	errFail := errors.New("business rule failed")
	cases := []struct {
		name    string
		fn      func(db *idempg.DB, ctx context.Context, tx pgx.Tx) error
		wantErr error
		want    []string
	}{
		{
			name: "commits",
			fn: func(db *idempg.DB, ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1)`)
				return err
			},
			want: []string{"a"},
		},
		{
			name: "rolls back on error",
			fn: func(db *idempg.DB, ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1)`); err != nil {
					return err
				}
				return errFail
			},
			wantErr: errFail,
		},
		{
			name: "nested calls join",
			fn: func(db *idempg.DB, ctx context.Context, outer pgx.Tx) error {
				if _, err := outer.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1)`); err != nil {
					return err
				}
				return db.WithTx(ctx, func(ctx context.Context, inner pgx.Tx) error {
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
			fn: func(db *idempg.DB, ctx context.Context, tx pgx.Tx) error {
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
			name: "a failed statement returned up rolls everything back",
			fn: func(db *idempg.DB, ctx context.Context, tx pgx.Tx) error {
				if err := insertPayment(ctx, db, "a"); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`)
				return err
			},
			wantErr: errAny,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t, url, idempg.Config{})
			migratePayments(t, db)
			err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
				return tc.fn(db, ctx, tx)
			})
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("WithTx = %v, want nil", err)
			case tc.wantErr == errAny && err == nil:
				t.Errorf("WithTx = nil, want an error")
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Errorf("WithTx = %v, want %v", err, tc.wantErr)
			}
			if got := payments(t, db); !slices.Equal(got, tc.want) {
				t.Errorf("committed payments = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWithTxPanic(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	// One connection: a transaction left open by the panic would keep the
	// next write waiting for it.
	db := openDB(t, url, idempg.Config{MaxConns: 1})
	migratePayments(t, db)
	ctx := t.Context()
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic of fn", p)
			}
		}()
		_ = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertPayment(ctx, db, "a"); err != nil {
				t.Error(err)
			}
			panic("boom")
		})
	}()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := insertPayment(wctx, db, "b"); err != nil {
		t.Fatalf("write after a panic: %v", err)
	}
	if got := payments(t, db); !slices.Equal(got, []string{"b"}) {
		t.Errorf("payments = %v, want [b] (a rolled back by the panic)", got)
	}
}

func TestWithTxContextOutlivesTransaction(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{})
	migratePayments(t, db)
	var kept context.Context
	if err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		kept = ctx
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := insertPayment(kept, db, "late"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("WithTx with the context of an ended transaction = %v, want pgx.ErrTxClosed", err)
	}
	if got := payments(t, db); len(got) != 0 {
		t.Errorf("payments = %v, want none", got)
	}
}

// A transaction of one DB does not capture WithTx calls on another, even on
// the same database.
func TestWithTxOtherDB(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db1, db2 := openDB(t, url, idempg.Config{}), openDB(t, url, idempg.Config{})
	migratePayments(t, db1)
	migratePayments(t, db2)
	errFail := errors.New("fail")
	err := db1.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		if err := insertPayment(ctx, db1, "one"); err != nil {
			return err
		}
		err := db2.WithTx(ctx, func(ctx context.Context, tx2 pgx.Tx) error {
			if _, err := tx2.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ('two', 1)`); err != nil {
				return err
			}
			return db1.WithTx(ctx, func(ctx context.Context, inner pgx.Tx) error {
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

// WithTx begins its transactions with Config.TxOptions; an empty isolation
// level is READ COMMITTED.
func TestWithTxOptions(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	cases := []struct {
		opts     pgx.TxOptions
		wantIso  string
		readOnly string
	}{
		{pgx.TxOptions{}, "read committed", "off"},
		{pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, "repeatable read", "off"},
		{pgx.TxOptions{IsoLevel: pgx.Serializable}, "serializable", "off"},
		{pgx.TxOptions{AccessMode: pgx.ReadOnly}, "read committed", "on"},
	}
	schema := freshSchema(t, url)
	for _, tc := range cases {
		db := openDB(t, url, idempg.Config{Schema: schema, TxOptions: tc.opts, MaxConns: 1})
		err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
			var iso, ro string
			if err := tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')`).Scan(&iso, &ro); err != nil {
				return err
			}
			if iso != tc.wantIso || ro != tc.readOnly {
				t.Errorf("TxOptions %+v: transaction is %q, read only %q; want %q, %q", tc.opts, iso, ro, tc.wantIso, tc.readOnly)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Store methods called with a context carrying a transaction join it: the
// claim commits or rolls back with the caller's writes, and Get in the
// transaction sees it.
func TestStoreJoinsCallerTransaction(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{Clock: idemtest.NewClock(idemtest.Start)})
	migratePayments(t, db)
	s := newStore(t, db)
	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	errFail := errors.New("fail")

	for _, commit := range []bool{false, true} {
		err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
			c, err := s.Claim(ctx, req)
			if err != nil || c.Outcome != idem.Acquired {
				t.Fatalf("Claim in a transaction = %v, %v", c.Outcome, err)
			}
			if r, err := s.Get(ctx, req.Scope, req.Key); err != nil || r.Token != c.Token {
				t.Errorf("Get in the transaction = %+v, %v; want the uncommitted claim", r, err)
			}
			if _, err := s.Get(t.Context(), req.Scope, req.Key); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Get outside the transaction = %v, want ErrNotFound (not committed yet)", err)
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
