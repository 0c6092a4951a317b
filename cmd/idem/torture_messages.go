package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/torture"
)

func (a *app) tortureMessagesCmd() *cobra.Command {
	var c torture.MessagesConfig
	var ackKills float64
	cmd := &cobra.Command{
		Use:   "messages",
		Short: "Every event published twice, consumers killed between commit and ack: each applied exactly once, in order?",
		Long: `Publish --events events, spread over --keys keys, and every one of them again
after (half of the copies under another message ID, which only the inbox can
catch), to --consumers consumer processes (children of this binary) that
compete for them and apply each in the inbox's transaction. Every --kill-every
a random consumer is SIGKILLed and started again; each consumer also SIGKILLs
itself at a rate of --ack-kills right after an event's effect committed and
before its acknowledgement, so that the broker delivers it again. With a
private broker, --restart-broker-every SIGKILLs the broker and starts it again
on its data.

By default the consumers de-duplicate by key and sequence number (a mark per
key in the inbox; a gap is held back), so each key's events must be applied
in order; --by-id de-duplicates by event ID instead, in batches, and competing
consumers then apply a key's events in any order (counted, not a violation).

The run lasts until every event is applied, or until none has been for
--timeout: a slow or busy machine makes a run longer, not failed, and a
stuck one still ends. Once every event is applied, and the redeliveries
have had --ack-wait and two seconds more, it checks from the database that
every event was applied exactly once, in its key's order, and nothing
dead-lettered. It prints the figures as a table and as lines
RESULT,torture-messages-<broker>[-<db>][-byid],<metric>,<value>,<unit>, and
exits 0 only when the promise held.

--broker is sqlite (a file in a temporary directory, which holds the inbox
too; the default), postgres://USER@HOST/DB (its transport and the inbox in a
fresh schema), nats://HOST:PORT (a stream of the run's own) or
amqp://USER:PASS@HOST:PORT/VHOST (an exchange and queues of the run's own)
or kafka://HOST:PORT[,HOST:PORT] (a topic of the run's own), with the inbox
in --db (sqlite, or postgres://…); or private-postgres, private-nats or
private-rabbitmq, a server the run starts itself in its temporary directory,
on 127.0.0.1 only; or private-kafka, kfake (franz-go's Kafka) in the run's
own process, which is never restarted. On Kafka, --ack-wait is the
consumers' session timeout (how soon a killed consumer's partitions move),
at least 6s on a broker of kafka://, whose group.min.session.timeout.ms
refuses less by default. Only a private broker is ever
restarted, never one that others share. Everything the run made is deleted
afterwards, and every consumer and server stopped, on failure and Ctrl-C
too.

  idem torture messages --events 1000000 --by-id
  idem torture messages --events 50000
  idem torture messages --broker nats://127.0.0.1:4222 --db postgres://postgres@127.0.0.1:5432/test --by-id --events 200000
  idem torture messages --broker private-rabbitmq --restart-broker-every 20s --by-id --events 100000
  idem torture messages --broker private-kafka --db postgres://postgres@127.0.0.1:5432/test --events 50000
  idem torture messages --broker private-kafka --db postgres://postgres@127.0.0.1:5432/test --events 100000 \
      --consumers 4 --churn-every 300ms --kill-every 5s

--churn-every has a random consumer leave its group cleanly (SIGTERM) and
join it again that often: on Kafka, a rebalance storm. The run is calm (no
churn, no kills by the run) until a fifth of the events are applied, and
the report sets the events applied per second under churn beside the calm
rate. On Kafka the consumers also say what their streams hold, and the run
holds it against their limit (MaxPending).`,
		Args: cobra.NoArgs,
	}
	fl := cmd.Flags()
	fl.StringVar(&c.Broker, "broker", "sqlite", "sqlite, postgres://…, nats://…, amqp://…, kafka://…, private-postgres, private-nats, private-rabbitmq or private-kafka")
	fl.StringVar(&c.DB, "db", "", "with a NATS, RabbitMQ or Kafka broker, the inbox's database: sqlite (the default) or postgres://USER@HOST/DB")
	fl.IntVar(&c.Events, "events", torture.DefaultEvents, "events published (each twice)")
	fl.IntVar(&c.Keys, "keys", torture.DefaultEventKeys, "ordering keys the events are spread over")
	fl.IntVar(&c.Consumers, "consumers", torture.DefaultConsumers, "consumer processes competing for the events")
	fl.BoolVar(&c.ByID, "by-id", false, "de-duplicate by event ID, in batches, instead of by key and sequence number (order then not promised)")
	fl.DurationVar(&c.KillEvery, "kill-every", torture.DefaultConsumerKillEvery, "time between two SIGKILLs of a random consumer (0 for none)")
	fl.Float64Var(&ackKills, "ack-kills", torture.DefaultAckKillRate, "chance that a consumer SIGKILLs itself between an event's commit and its acknowledgement (0 for none)")
	fl.DurationVar(&c.AckWait, "ack-wait", torture.DefaultAckWait, "the consumers' ack wait: how soon what a killed consumer held is delivered again")
	fl.DurationVar(&c.RestartBrokerEvery, "restart-broker-every", 0, "SIGKILL the private broker this often and start it again (0 for never)")
	fl.DurationVar(&c.ChurnEvery, "churn-every", 0, "time between two consumers leaving their group cleanly and joining again, a rebalance storm; the run is calm until a fifth of the events are applied, and reports both rates (0 for none)")
	fl.DurationVar(&c.Timeout, "timeout", torture.DefaultMessagesTimeout, "longest the run may go, once publishing began, without an event applied: it ends then, and the events not applied are violations; a slow run that keeps applying events may take longer")
	fl.DurationVar(&c.Drain, "drain", torture.DefaultMessagesDrain, "once the timeout passed without an event applied, every event published, how long to go on with the faults stopped, to tell slow events from lost ones (0 for none)")
	fl.IntVar(&c.Backlog, "backlog", torture.DefaultBacklog, "most messages published ahead of the consumers (0 for no bound)")
	fl.Uint64Var(&c.Seed, "seed", 0, "seed of the run's choices (0 for a random one, printed first and in the report)")
	var consumerLog string
	fl.StringVar(&consumerLog, "consumer-log", "", "write every line the consumers log to this file")
	fl.BoolVar(&c.Unsafe, "unsafe-no-inbox", false, "consume with an inbox that records nothing, which must fail the check (the torture's own test)")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		switch {
		case c.Events < 1 || c.Keys < 1 || c.Consumers < 1:
			return &usageError{errors.New("--events, --keys and --consumers must be positive")}
		case c.Backlog < 0:
			return &usageError{errors.New("--backlog must not be negative")}
		case ackKills < 0 || ackKills >= 1:
			return &usageError{fmt.Errorf("--ack-kills must be at least 0 and below 1, got %g", ackKills)}
		case c.KillEvery < 0 || c.RestartBrokerEvery < 0 || c.ChurnEvery < 0 || c.Drain < 0 || c.AckWait <= 0 || c.Timeout <= 0:
			return &usageError{errors.New("--kill-every, --restart-broker-every, --churn-every and --drain must not be negative; --ack-wait and --timeout must be positive")}
		case c.RestartBrokerEvery > 0 && c.Broker == torture.PrivateKafka:
			return &usageError{errors.New("--restart-broker-every cannot restart private-kafka: kfake runs in this process and keeps nothing on disk")}
		case c.RestartBrokerEvery > 0 && !strings.HasPrefix(c.Broker, "private-"):
			return &usageError{errors.New("--restart-broker-every needs --broker private-postgres, private-nats or private-rabbitmq: the run restarts only servers it started itself, never one that others share")}
		}
		switch c.Broker {
		case "sqlite", torture.PrivatePostgres, torture.PrivateNATS, torture.PrivateRabbitMQ, torture.PrivateKafka:
		default:
			if t, err := parseDB(c.Broker); err == nil && t.postgres {
				break
			}
			if _, err := parseBroker(c.Broker); err != nil {
				return &usageError{fmt.Errorf("--broker must be sqlite, postgres://…, nats://…, amqp://…, kafka://…, private-postgres, private-nats, private-rabbitmq or private-kafka")}
			}
		}
		if c.DB != "" {
			if c.Broker == "sqlite" || c.Broker == torture.PrivatePostgres || strings.HasPrefix(c.Broker, "postgres") {
				return &usageError{errors.New("--db goes with a NATS, RabbitMQ or Kafka broker: on SQLite and PostgreSQL the inbox is in the broker's database")}
			}
			if c.DB != "sqlite" {
				if t, err := parseDB(c.DB); err != nil || !t.postgres {
					return &usageError{errors.New("--db must be sqlite or postgres://USER@HOST/DB")}
				}
			}
		}
		// Zero means the default in MessagesConfig; on the command line it
		// means none.
		c.AckKillRate = ackKills
		if ackKills == 0 {
			c.AckKillRate = -1
		}
		if c.KillEvery == 0 {
			c.KillEvery = -1
		}
		if c.Backlog == 0 {
			c.Backlog = -1
		}
		if c.Drain == 0 {
			c.Drain = -1
		}
		if consumerLog != "" {
			f, err := os.Create(consumerLog)
			if err != nil {
				return fmt.Errorf("--consumer-log: %w", err)
			}
			defer f.Close()
			c.ConsumerLog = f
		}
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this binary to start the consumers: %w", err)
		}
		c.Executable = exe
		c.Env = os.Environ()
		c.Progress = a.stderr
		// The seed is drawn here, so that an error ending the run names
		// it as well as the progress line that opens it.
		if c.Seed == 0 {
			c.Seed = torture.NewSeed()
		}
		rep, err := torture.RunMessages(cmd.Context(), &c)
		if err != nil {
			return scrubURLs(withSeed(err, c.Seed), c.Broker, c.DB)
		}
		return a.tortureVerdict(rep, len(rep.Violations))
	})
	return cmd
}

// tortureMessagesWorkerCmd is one consumer of 'idem torture messages', which
// starts it with its configuration in the environment.
func (a *app) tortureMessagesWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "messages-worker",
		Short:  "One consumer of 'idem torture messages' (started by it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.action(func(cmd *cobra.Command, _ []string) error {
			config := os.Getenv(torture.WorkerEnv)
			if config == "" {
				return &usageError{errors.New("messages-worker is started by 'idem torture messages', which sets " + torture.WorkerEnv)}
			}
			return torture.RunWorker(cmd.Context(), config, a.stderr)
		}),
	}
}
