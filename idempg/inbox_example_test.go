package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// A settlement consumer adds each payment's amount to a total: an effect
// that is not idempotent, so only the inbox protects it. The handler's
// write and the inbox row commit in one PostgreSQL transaction, and the
// redelivery of the same event changes nothing.
func ExampleInbox() {
	ctx := context.Background()
	db, err := idempg.Open(ctx, exampleURL(), &idempg.Config{Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	defer db.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{db.Schema()}.Sanitize()+` CASCADE`)

	err = db.Migrate(ctx, "settlement", fstest.MapFS{
		"0001_totals.sql": {Data: []byte(`CREATE TABLE totals (tenant text PRIMARY KEY, total bigint NOT NULL);`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	inbox, err := idempg.NewInbox(ctx, db)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The handler joins the inbox's transaction through db.WithTx.
	settle := func(amount int64) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO totals (tenant, total) VALUES ('acme', $1)
					ON CONFLICT (tenant) DO UPDATE SET total = totals.total + excluded.total`, amount)
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

	var total int64
	if err := db.Pool().QueryRow(ctx, `SELECT total FROM totals WHERE tenant = 'acme'`).Scan(&total); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("total:", total)
	// Output:
	// first delivery: settled
	// redelivery: duplicate, skipped
	// total: 1250
}
