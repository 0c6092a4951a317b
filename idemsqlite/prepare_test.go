package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemsqlite"
)

// TestPrepare runs a statement that Prepare made in WithTx transactions,
// the committed one's write kept and the rolled-back one's undone, and
// refuses, at once, to prepare inside a transaction of the DB or to
// prepare SQL that does not parse.
func TestPrepare(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := t.Context()
	if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE counters (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	add, err := db.Prepare(ctx, `INSERT INTO counters (id, n) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1`)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer add.Close()
	for range 3 {
		if err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.StmtContext(ctx, add).ExecContext(ctx, 1)
			return err
		}); err != nil {
			t.Fatalf("WithTx: %v", err)
		}
	}
	undone := errors.New("undone")
	if err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.StmtContext(ctx, add).ExecContext(ctx, 1); err != nil {
			return err
		}
		return undone
	}); !errors.Is(err, undone) {
		t.Fatalf("WithTx = %v, want %v", err, undone)
	}
	var n int
	if err := db.Reader().QueryRowContext(ctx, `SELECT n FROM counters WHERE id = 1`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("n = %d after three committed additions and one rolled back, want 3", n)
	}

	// Inside a transaction the writer is taken: Prepare says so instead of
	// waiting for it (the deadline only bounds a regression).
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = db.WithTx(bounded, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counters SET n = n + 100`); err != nil {
			return err
		}
		_, err := db.Prepare(ctx, `SELECT n FROM counters`)
		return err
	})
	if !errors.Is(err, idemsqlite.ErrPrepareInTx) {
		t.Errorf("Prepare in WithTx = %v, want ErrPrepareInTx", err)
	}

	_, err = db.Prepare(ctx, `SELEKT n FROM counters`)
	if err == nil || !strings.Contains(err.Error(), "SELEKT") {
		t.Errorf("Prepare of SQL that does not parse = %v, want an error naming the statement", err)
	}
	if err := db.Reader().QueryRowContext(ctx, `SELECT n FROM counters WHERE id = 1`).Scan(&n); err != nil || n != 3 {
		t.Errorf("n = %d, %v after the refused calls, want 3 (nothing changed)", n, err)
	}
}
