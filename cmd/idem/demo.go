package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

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
	cmd.AddCommand(a.demoMessagesCmd())
	return cmd
}

func (a *app) demoMessagesCmd() *cobra.Command {
	var capacity int
	var keep, verbose bool
	cmd := &cobra.Command{
		Use:   "messages",
		Short: "Run the lab's second half: redeliveries, a poison message, a retry storm, reordered events",
		Long: `Run the lab's second half, on the messages a consumer receives. Four
scenarios, each against a consumer built the unsafe way and one built with
idem, on the same events and faults: a redelivery (an acknowledgement lost,
a consumer killed between its commit and its ack) counted twice without an
inbox and once with it; a poison message that blocks its queue when retried
forever, and goes to the dead letters after bounded retries; a retry storm
that knocks a recovering service over without jitter and not with it; and
events reordered by a retry, which an additive or a "set the status"
consumer gets wrong without per-key order, and a versioned one gets right
in any order.

Everything runs on one SQLite file, with idem's consumer, inbox, transport
and dead letters; time is the lab's own clock, so the figures are the same
on every run. --keep keeps the file, to read the poison's dead letter with
'idem dlq show' or 'idem console'.

Exit status 0 means every row showed what it exists to show.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().IntVar(&capacity, "capacity", demo.DefaultCapacity, "calls per 100ms the retry storm's service serves before it falls over again")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the lab's SQLite file, and print where it is")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log what the consumers do, on stderr")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		if capacity < 1 || capacity > 10_000 {
			return &usageError{fmt.Errorf("--capacity must be between 1 and 10000, got %d", capacity)}
		}
		logger := slog.New(slog.DiscardHandler)
		if verbose {
			logger = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		opts := &demo.MessagesOptions{Out: a.stdout, Capacity: capacity, Logger: logger}
		if keep {
			dir, err := os.MkdirTemp("", "idem-demo-messages-*")
			if err != nil {
				return err
			}
			opts.Dir = dir
		}
		rep, err := demo.RunMessages(cmd.Context(), opts)
		if rep != nil && rep.DB != "" {
			fmt.Fprintf(a.stdout, "\nThe lab's file is kept: %s (remove its directory when done).\n", rep.DB)
		}
		if err != nil {
			return err
		}
		if !rep.OK() {
			fmt.Fprintln(a.stderr, "idem: the demo did not show what it should (see above)")
			return &silentError{errors.New("demo not OK")}
		}
		return nil
	})
	return cmd
}
