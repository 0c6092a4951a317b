package idempg_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idempg"
)

// errAny stands for "some error" in the tables below.
var errAny = errors.New("any error")

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
