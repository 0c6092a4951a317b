package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

func (a *app) reconcileCmd() *cobra.Command {
	var (
		dbURL, pgSchema, netURL, netKey string
		since                           string
	)
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Compare the service's payments with the card network's charges",
		Long: `Compare the payments that idem serve --acquirer recorded in --db with the
charges the card network (idem acquirer) made, and print every difference:
a charge no payment records (money taken that the books do not show, unless
it was refunded in full), a payment whose charge the network does not have,
a payment and its charge of different amounts, one logical payment (a
tenant's idempotency key) charged twice, and one charge recorded by two
payments. Exits 1 when there is a difference.

--since limits the comparison to what was made at or after a time (RFC 3339,
or a duration back from now such as 24h); by default everything is compared.
The card network is asked only for the charges made since then.

It may run against a live service: it reads the payments, then the charges,
then the payments again, so a payment made while it reads is never a
difference. It only reads: it never migrates --db, and a database without
the service's schema is refused with an error that says so.`,
		Args: cobra.NoArgs,
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	cmd.Flags().StringVar(&netURL, "acquirer", "", "the card network: http://HOST:PORT (required)")
	cmd.Flags().StringVar(&netKey, "acquirer-key", "", "the card network's API key (default from $"+envAcquirerKey+")")
	cmd.Flags().StringVar(&since, "since", "", "compare only what was made at or after this time: RFC 3339, or a duration back from now (24h)")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		ctx := cmd.Context()
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		if netURL == "" {
			return &usageError{errors.New("--acquirer is required: the card network to compare with")}
		}
		from, err := parseSince(since, time.Now())
		if err != nil {
			return &usageError{err}
		}
		if !cmd.Flags().Changed("acquirer-key") {
			netKey, _ = a.lookupEnv(envAcquirerKey)
		}
		net, err := acquirer.NewClient(acquirer.ClientConfig{URL: netURL, APIKey: netKey, Timeout: 5 * time.Minute})
		if err != nil {
			return &usageError{fmt.Errorf("--acquirer: %w", err)}
		}
		db, err := openDB(ctx, dbURL, pgSchema, true)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()
		rec, err := payments.Reconcile(ctx, db.sqlite, db.pg, net, from)
		if err != nil {
			return err
		}
		window := "everything"
		if !from.IsZero() {
			window = "since " + from.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(a.stdout, "reconcile: %d payments of %s and %d charges at %s, %s\n", rec.Payments, db.shown, rec.Charges, netURL, window)
		for _, d := range rec.Differences {
			fmt.Fprintf(a.stdout, "DIFFERENCE %s\n", d)
		}
		if len(rec.Differences) > 0 {
			fmt.Fprintf(a.stdout, "%d difference(s): the books do not agree\n", len(rec.Differences))
			return &silentError{fmt.Errorf("%d differences", len(rec.Differences))}
		}
		fmt.Fprintln(a.stdout, "0 differences: every charge is a payment's, every payment's charge is there, once")
		return nil
	})
	return cmd
}

// parseSince reads --since: an RFC 3339 time, or a duration back from now.
// Empty is the zero time: everything.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-12-01T00:00:00Z) or a duration back from now (24h)", s)
	}
	return now.Add(-d), nil
}
