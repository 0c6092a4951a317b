package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing/fstest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// A settlement consumer adds each payment's amount to a total: an effect
// that is not idempotent, so only the inbox protects it. The handler's
// write and the inbox row commit in one transaction, and the duplicate
// delivery of the same event changes nothing.
func ExampleInbox() {
	dir, err := os.MkdirTemp("", "idemsqlite-inbox")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "settlement.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	err = db.Migrate(ctx, "settlement", fstest.MapFS{
		"0001_totals.sql": {Data: []byte(`CREATE TABLE totals (tenant TEXT PRIMARY KEY, total INTEGER NOT NULL);`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The handler joins the inbox's transaction through db.WithTx.
	settle := func(amount int) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO totals (tenant, total) VALUES ('acme', ?)
					ON CONFLICT (tenant) DO UPDATE SET total = total + excluded.total`, amount)
				return err
			})
		}
	}

	for _, delivery := range []string{"first delivery", "redelivery"} {
		err := inbox.Process(ctx, "settlement", "evt-1", settle(1250))
		switch {
		case errors.Is(err, idem.ErrDuplicate):
			fmt.Println(delivery+":", "duplicate, skipped")
		case err != nil:
			fmt.Println(delivery+":", err)
		default:
			fmt.Println(delivery+":", "settled")
		}
	}

	var total int
	if err := db.Reader().QueryRowContext(ctx, `SELECT total FROM totals WHERE tenant = 'acme'`).Scan(&total); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("total:", total)
	// Output:
	// first delivery: settled
	// redelivery: duplicate, skipped
	// total: 1250
}
