package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"
)

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
