package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

func (a *app) migrateCmd() *cobra.Command {
	var dbURL, pgSchema string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update the database's tables",
		Long: `Create the database (a SQLite file, or a PostgreSQL schema) if it does not
exist and apply every schema migration (the idempotency keys' and the payment
service's). Applying them again is harmless, and on PostgreSQL several
processes may migrate one schema at once (an advisory lock serialises them);
'idem serve' applies them too when it starts.

On PostgreSQL each migration runs in a transaction, where an index cannot be
built CONCURRENTLY: one a migration adds holds its table's writes while it is
built. On a large payments table, build the index 'idem reconcile' pages
through first, outside any transaction, while the service runs (the
migration then finds it and takes no lock):

  CREATE INDEX CONCURRENTLY payments_charged_created ON payments (created_at, id) WHERE charge_id IS NOT NULL;

Should it fail, it leaves an INVALID index: DROP INDEX CONCURRENTLY
payments_charged_created, and build it again (a migration that finds it
INVALID drops it and builds it anew, holding the writes).`,
		Args: cobra.NoArgs,
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		ctx := cmd.Context()
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		db, err := openDB(ctx, dbURL, pgSchema, false)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()

		if db.pg != nil {
			store, err := idempg.NewStore(ctx, db.pg)
			if err != nil {
				return fmt.Errorf("migrating the idempotency keys' tables: %w", err)
			}
			store.Close()
		} else if _, err := idemsqlite.NewStore(ctx, db.sqlite, nil); err != nil {
			return fmt.Errorf("migrating the idempotency keys' tables: %w", err)
		}
		fmt.Fprintf(a.stdout, "%s: idempotency key tables are up to date\n", db.shown)

		if db.pg != nil {
			err = payments.MigratePostgres(ctx, db.pg)
		} else {
			err = payments.Migrate(ctx, db.sqlite)
		}
		if err != nil {
			return fmt.Errorf("migrating the payment service's tables: %w", err)
		}
		fmt.Fprintf(a.stdout, "%s: payment service tables are up to date\n", db.shown)
		return nil
	})
	return cmd
}
