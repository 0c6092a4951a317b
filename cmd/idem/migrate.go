package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/payments"
)

func (a *app) migrateCmd() *cobra.Command {
	var dbURL string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update the database's tables",
		Long: `Create the database if it does not exist and apply every schema migration
(the idempotency keys' and the payment service's). Applying them again is
harmless; 'idem serve' applies them too when it starts.`,
		Args: cobra.NoArgs,
	}
	dbFlag(cmd, &dbURL)
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		ctx := cmd.Context()
		db, err := openDB(dbURL, false)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()

		if _, err := idemsqlite.NewStore(ctx, db, nil); err != nil {
			return fmt.Errorf("migrating the idempotency keys' tables: %w", err)
		}
		fmt.Fprintf(a.stdout, "%s: idempotency key tables are up to date\n", db.Path())

		// The payment service applies its own migrations when it is built;
		// building it with a throw-away key and closing it at once serves
		// nothing and starts no server.
		svc, err := payments.New(ctx, &payments.Config{
			DB:      db,
			APIKeys: map[string]string{"migrate-only": "migrate"},
			Logger:  slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return fmt.Errorf("migrating the payment service's tables: %w", err)
		}
		if err := svc.Close(); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s: payment service tables are up to date\n", db.Path())
		return nil
	})
	return cmd
}
