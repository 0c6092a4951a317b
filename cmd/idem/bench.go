package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/bench"
)

func (a *app) benchCmd() *cobra.Command {
	var o bench.Options
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the middleware on PostgreSQL and Redis against a hand-written minimum",
		Long: `Measure what idem's protection costs. For each store given, it runs the
idempotency middleware in front of a trivial handler and, in the same run,
the least anyone could write by hand for the same guarantee on the same
store, and prints requests/s, p50 and p99 for both and their ratio:

  Redis:      one SET NX PX to claim plus one SET of the response per request
  PostgreSQL: one transaction: INSERT … ON CONFLICT DO NOTHING for the key,
              the balance update, the payment insert, the key's response update

plus replays (a key already completed) against the minimum's read.
PostgreSQL work happens in a schema of its own, dropped afterwards; Redis
keys under a prefix of their own, deleted afterwards.

  idem bench --postgres postgres://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/0`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&o.PostgresURL, "postgres", "", "PostgreSQL URL to measure")
	cmd.Flags().StringVar(&o.RedisURL, "redis", "", "Redis URL to measure")
	cmd.Flags().IntVar(&o.Requests, "requests", 2000, "requests per side and round")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 3, "rounds; the sides alternate and the median round counts")
	cmd.Flags().IntVar(&o.Concurrency, "concurrency", 8, "requests in flight")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		if o.PostgresURL == "" && o.RedisURL == "" {
			return &usageError{fmt.Errorf("give --postgres, --redis or both")}
		}
		if o.Requests < 1 || o.Rounds < 1 || o.Concurrency < 1 {
			return &usageError{fmt.Errorf("--requests, --rounds and --concurrency must be positive")}
		}
		o.Out = a.stderr
		cs, err := bench.Run(cmd.Context(), &o)
		if err != nil {
			return err
		}
		bench.Print(a.stdout, cs)
		for _, c := range cs {
			if c.Case == "first" {
				for _, r := range cs {
					if r.Store == c.Store && r.Case == "replay" {
						fmt.Fprintf(a.stdout, "%s: replays run at %.2fx the speed of first executions\n",
							c.Store, r.Middleware.PerSecond/c.Middleware.PerSecond)
					}
				}
			}
		}
		return nil
	})
	return cmd
}
