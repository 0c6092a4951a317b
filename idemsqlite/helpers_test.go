package idemsqlite_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"

	"github.com/idem-go/idem/idemsqlite"
)

// migratePayments creates the application table the tests write to, in the
// same file as the keys, the way the payment service does.
func migratePayments(t *testing.T, db *idemsqlite.DB) {
	t.Helper()
	err := db.Migrate(t.Context(), "test_payments", fstest.MapFS{
		"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// insertPayment writes a payment the way a handler does: through WithTx,
// so that inside CompleteTx's work it joins the transaction.
func insertPayment(ctx context.Context, db *idemsqlite.DB, id string) error {
	return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES (?, ?)`, id, 1250)
		return err
	})
}

// payments returns the committed payment ids, in order.
func payments(t *testing.T, db *idemsqlite.DB) []string {
	t.Helper()
	rows, err := db.Reader().QueryContext(t.Context(), `SELECT id FROM payments ORDER BY id`)
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
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}
