package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/cmd/idem/internal/bench"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/internal/secreturl"
)

func (a *app) benchCmd() *cobra.Command {
	var o bench.Options
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the middleware on PostgreSQL, Redis and SQLite against a hand-written minimum",
		Long: `Measure what idem's protection costs. For each store it runs the idempotency
middleware in front of a trivial handler and, in the same run, the least
anyone could write by hand for the same guarantee on the same store, and
prints requests/s, p50 and p99 for both and their ratio:

  Redis:      one SET NX PX to claim plus one SET of the response per request
  PostgreSQL: one transaction: INSERT … ON CONFLICT DO NOTHING for the key,
              the balance update, the payment insert, the key's response update
  SQLite:     the same transaction as PostgreSQL's, on the single writer

plus replays (a key already completed) against the minimum's read, and, on
PostgreSQL and SQLite, "slow": rounds of --concurrency first executions at
once whose handler waits --slow-handler before its writes (as one that calls
another service first), on both sides; its figure is a round's wall time
(round_ms), which a store that made one request's wait everyone's would
multiply by up to --concurrency. SQLite is
measured on a temporary file, always when neither --postgres nor --redis is
given, and beside them with --sqlite. PostgreSQL work happens in a schema of
its own, dropped afterwards; Redis keys under a prefix of their own, deleted
afterwards. Every round's figures are also printed as lines
RESULT,<name>,<metric>,<value>,<unit>, a format other benchmarks can print
too, for runs taken in turn (idem-http-<store>-<case> and
minimum-http-<store>-<case>).

  idem bench --postgres postgres://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/0 --sqlite
  idem bench messages --postgres …   (the message half: see idem bench messages --help)`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&o.PostgresURL, "postgres", "", "PostgreSQL URL to measure")
	cmd.Flags().StringVar(&o.RedisURL, "redis", "", "Redis URL to measure")
	cmd.Flags().BoolVar(&o.SQLite, "sqlite", false, "measure SQLite too (always, when neither --postgres nor --redis is given)")
	cmd.Flags().IntVar(&o.Requests, "requests", 2000, "requests per side and round of first executions")
	cmd.Flags().IntVar(&o.ReplayRequests, "replay-requests", 0, "requests per side and round of replays (default 10 × --requests)")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 5, "rounds; the sides alternate, in turned order each round, and the ratio is the median of the rounds' ratios")
	cmd.Flags().IntVar(&o.Concurrency, "concurrency", 8, "requests in flight")
	cmd.Flags().DurationVar(&o.SlowHandler, "slow-handler", 100*time.Millisecond, "how long the handler of the slow case waits before its writes; negative skips the case")
	cmd.Flags().BoolVar(&o.Sealed, "sealed", false, "measure the middleware with keys sealed and kept bodies encrypted (what IDEM_KEY_SECRET and IDEM_BODY_KEYS turn on); its RESULT lines are idem-http-sealed-<store>-<case>")
	cmd.Flags().BoolVar(&o.StoreReplays, "store-replays", false, "measure replays read from the store, with the answers kept in memory after a completion turned off (idemhttp's MemoryReplayFor); its RESULT lines are idem-http-storereplays-<store>-<case>")
	cmd.Flags().BoolVar(&o.GRPC, "grpc", false, "measure idemgrpc's interceptor too, on SQLite and PostgreSQL, against a hand-written interceptor; its RESULT lines are idem-grpc-<store>-<case>")
	cmd.Flags().StringVar(&o.Side, "side", "", "measure one side alone, middleware or minimum (for a --cpuprofile of it); no ratio is printed")
	var cpuProfile string
	cmd.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole measurement (both sides) to this file, for go tool pprof")
	cmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if cpuProfile == "" {
			return nil
		}
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		cmd.PostRunE = func(*cobra.Command, []string) error {
			pprof.StopCPUProfile()
			return f.Close()
		}
		return nil
	}
	cmd.AddCommand(a.benchMessagesCmd())
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		if o.Requests < 1 || o.Rounds < 1 || o.Concurrency < 1 || o.ReplayRequests < 0 {
			return &usageError{fmt.Errorf("--requests, --rounds and --concurrency must be positive, and --replay-requests not negative")}
		}
		if o.Side != "" && o.Side != "middleware" && o.Side != "minimum" {
			return &usageError{fmt.Errorf("--side must be middleware or minimum, not %q", o.Side)}
		}
		o.Out = a.stderr
		o.Results = a.stdout
		cs, err := bench.Run(cmd.Context(), &o)
		if err != nil {
			return scrubURLs(err, o.PostgresURL, o.RedisURL)
		}
		fmt.Fprintln(a.stdout)
		bench.Print(a.stdout, cs)
		for _, c := range cs {
			if c.Case == "first" {
				for _, r := range cs {
					if r.Store == c.Store && r.Case == "replay" && c.Middleware.PerSecond > 0 {
						fmt.Fprintf(a.stdout, "%s: replays run at %.2fx the speed of first executions\n",
							c.Store, r.Middleware.PerSecond/c.Middleware.PerSecond)
					}
				}
			}
			if c.Case == "slow" && c.Ratio > 0 {
				fmt.Fprintf(a.stdout, "%s: %d first executions at once, each waiting %v before its writes, take %.2fx the minimum's wall time\n",
					c.Store, o.Concurrency, o.SlowHandler, 1/c.Ratio)
			}
		}
		return nil
	})
	return cmd
}

func (a *app) benchMessagesCmd() *cobra.Command {
	var o bench.MessagesOptions
	cmd := &cobra.Command{
		Use:   "messages",
		Short: "Measure the message half (consumer, transport, relay, pipeline) against hand-written minimums",
		Long: `Measure the message half on SQLite (a temporary file), on PostgreSQL when
--postgres is given, and on NATS JetStream and RabbitMQ when their URLs are
given, and on Kafka when --kafka names its brokers (their inboxes in
PostgreSQL, or SQLite without it). Each backend gets:

  idem-consumer-B        consumer.Consumer with its defaults: dedup by message ID
                         in the inbox, a counter incremented in the inbox's
                         transaction, over a backlog spread over --keys keys
  idem-consumer-batch-B  the same with a batch handler (one statement a batch)
  minimum-consumer-B     the same work by hand, one transaction per message
  idem-transport-B       one stream taking and acknowledging the backlog
  idem-publish-B         (brokers) publishing the consumer's backlog through
                         the transport; minimum-publish-B with the client alone
  idem-relay-B           the outbox relay moving --messages entries
  idem-pipeline-B        the payment service in process: payments, settled/s

Every figure is printed, as it is measured, as a line
RESULT,<name>,<metric>,<value>,<unit>, then the medians as a table, with the ratios of idem's consumers to
the minimum beside them. Measurements run in turn, round after round.

  idem bench messages --postgres postgres://postgres@127.0.0.1:5432/test \
      --nats nats://127.0.0.1:4222 --amqp amqp://guest:guest@127.0.0.1:5672/ \
      --kafka 127.0.0.1:9092

--kafka private measures kfake (franz-go's Kafka) started in this process, as
the tests use it where no Kafka broker can be installed: it shares the
machine with what it measures, so its figures say how idem's consumer
compares with the minimum, not what a Kafka cluster carries.`,
		Args: cobra.NoArgs,
	}
	fl := cmd.Flags()
	fl.StringVar(&o.PostgresURL, "postgres", "", "PostgreSQL URL to measure (and to hold the brokers' inboxes)")
	fl.StringVar(&o.NATSURL, "nats", "", "NATS JetStream URL to measure")
	fl.StringVar(&o.AMQPURL, "amqp", "", "RabbitMQ URL to measure")
	var kafka string
	fl.StringVar(&kafka, "kafka", "", "Kafka brokers to measure, HOST:PORT[,HOST:PORT] (or kafka://…), or private: kfake in this process")
	fl.IntVar(&o.Messages, "messages", 20000, "messages per measurement")
	fl.IntVar(&o.Keys, "keys", 100, "ordering keys the messages are spread over")
	fl.IntVar(&o.Rounds, "rounds", 3, "rounds; the median counts")
	fl.StringSliceVar(&o.Only, "only", nil, "measure only these (names as in the RESULT lines)")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		if o.Messages < 1 || o.Keys < 1 || o.Rounds < 1 {
			return &usageError{fmt.Errorf("--messages, --keys and --rounds must be positive")}
		}
		if kafka == "private" {
			// kfake, in this process, for as long as the bench runs.
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				return fmt.Errorf("--kafka private: starting kfake: %w", err)
			}
			defer c.Close()
			kafka = strings.Join(c.ListenAddrs(), ",")
		}
		if kafka != "" {
			seeds, err := idemkafka.ParseURL(kafka)
			if err != nil {
				return &usageError{fmt.Errorf("--kafka: %w", err)}
			}
			o.KafkaSeeds = seeds
		}
		o.Out = a.stderr
		o.Results = a.stdout
		fs, err := bench.Messages(cmd.Context(), &o)
		if len(fs) > 0 {
			fmt.Fprintln(a.stdout)
			bench.PrintFigures(a.stdout, fs)
		}
		return scrubURLs(err, o.PostgresURL, o.NATSURL, o.AMQPURL)
	})
	return cmd
}

// scrubURLs masks in err's message the secrets of every URL the
// measurement was given: the drivers' errors may quote them.
func scrubURLs(err error, urls ...string) error {
	for _, u := range urls {
		err = secreturl.Scrub(err, u)
	}
	return err
}
