package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
)

func (a *app) demoCmd() *cobra.Command {
	var customers int
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the lab: retries double charge without idempotency keys, never with them",
		Long: `Run the lab. It starts the payment service in-process twice, on throw-away
databases: first with idempotency switched off, then as shipped. Against each
it plays the ways one payment reaches a service more than once (a frozen
screen, a lost response, a retry storm, a transient failure), reads back what
every customer was charged, and prints the verdicts side by side.

Exit status 0 means it showed what it should: double charges without
protection, exactly one charge per payment with it.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().IntVar(&customers, "customers", 8, "customers per scenario, each paying once")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log what the services do, on stderr")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		if customers < 1 || customers > 1000 {
			return &usageError{fmt.Errorf("--customers must be between 1 and 1000, got %d", customers)}
		}
		logger := slog.New(slog.DiscardHandler)
		if verbose {
			logger = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		rep, err := demo.Run(cmd.Context(), &demo.Options{Out: a.stdout, Customers: customers, Logger: logger})
		if err != nil {
			return err
		}
		if !rep.OK() {
			// The report's own closing lines already say what went wrong.
			fmt.Fprintln(a.stderr, "idem: the demo did not show what it should (see above)")
			return &silentError{errors.New("demo not OK")}
		}
		return nil
	})
	return cmd
}
