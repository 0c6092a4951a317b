package torture

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/localserver"
)

// The brokers a message torture starts itself (MessagesConfig.Broker),
// which it may restart (all but kfake).
const (
	PrivatePostgres = "private-postgres"
	PrivateNATS     = "private-nats"
	PrivateRabbitMQ = "private-rabbitmq"
	// PrivateKafka is kfake, franz-go's Kafka, in the run's own process:
	// no Kafka can be installed on the machines the project runs on. It
	// keeps nothing on disk, so it is never restarted.
	PrivateKafka = "private-kafka"
)

// Defaults of MessagesConfig.
const (
	DefaultEvents            = 1_000_000
	DefaultEventKeys         = 1000
	DefaultConsumers         = 2
	DefaultConsumerKillEvery = 5 * time.Second
	DefaultAckKillRate       = 0.0005
	DefaultAckWait           = 2 * time.Second
	DefaultMessagesTimeout   = 5 * time.Minute
	DefaultMessagesDrain     = 2 * time.Minute
	DefaultBacklog           = 100_000
)

// publishBatch is how many events one Publish call carries; each batch's
// copies follow the next batch, so that a copy comes after its original
// but not right behind it.
const publishBatch = 500

// publishPatience bounds how long a batch's publication may keep failing,
// longer than a broker's restart.
const publishPatience = 2 * time.Minute

// MessagesConfig configures RunMessages. The zero value of each field but
// Executable means its default.
type MessagesConfig struct {
	// Executable is the binary whose `torture messages-worker` command runs
	// RunWorker: the consumers are child processes of it, so that they can
	// be SIGKILLed. Required.
	Executable string
	// WorkerArgs are the arguments that run RunWorker. Defaults to
	// "torture", "messages-worker".
	WorkerArgs []string
	// Env is the consumers' environment, to which the run adds WorkerEnv.
	Env []string

	// Broker carries the events: "sqlite" (the SQLite file that holds the
	// inbox too), a PostgreSQL URL (its transport, in a fresh schema that
	// holds the inbox too), nats://HOST:PORT (a JetStream stream of the
	// run's own) or amqp://USER:PASS@HOST:PORT/VHOST (an exchange and
	// queues of the run's own); or PrivatePostgres, PrivateNATS or
	// PrivateRabbitMQ, a server of the run's own, started in its temporary
	// directory, which RestartBrokerEvery may restart. Defaults to
	// "sqlite".
	Broker string
	// DB holds the inbox, the dead letters and the effects when the broker
	// is NATS or RabbitMQ: "sqlite" or a PostgreSQL URL (a fresh schema).
	// With SQLite or PostgreSQL as the broker it must be empty: the inbox
	// is in the broker's database. Defaults to "sqlite".
	DB string

	// Events is how many events are published, each once more after.
	// Defaults to DefaultEvents.
	Events int
	// Keys is how many ordering keys the events are spread over. Defaults
	// to DefaultEventKeys.
	Keys int
	// Consumers is how many consumer processes compete for the events.
	// Defaults to DefaultConsumers.
	Consumers int
	// KillEvery is the time between two SIGKILLs of a random consumer.
	// Defaults to DefaultConsumerKillEvery; negative means none.
	KillEvery time.Duration
	// AckKillRate is the chance that a consumer SIGKILLs itself after a
	// message's effect committed, before its acknowledgement. Defaults to
	// DefaultAckKillRate; negative means none.
	AckKillRate float64
	// AckWait is the consumers' ack wait: how soon a broker delivers again
	// what a killed consumer held. Defaults to DefaultAckWait.
	AckWait time.Duration
	// RestartBrokerEvery SIGKILLs the private broker that often and starts
	// it again on its data, never while a consumer starts. Only a private
	// broker is ever restarted. Defaults to 0: never.
	RestartBrokerEvery time.Duration
	// ChurnEvery is the time between two consumers leaving their group
	// (SIGTERM: a clean stop, which on Kafka leaves the group at once) and
	// joining it again (started again at once): a rebalance storm. With
	// churn, the run is calm (no churn, no kills by the run) until a fifth
	// of the events are applied, and the report sets the rate under churn
	// beside the calm rate. Defaults to 0: none.
	ChurnEvery time.Duration
	// ByID de-duplicates by the event's ID, in batches, instead of by its
	// key and sequence number: competing consumers may then apply a key's
	// events out of order, which is reported, not a violation.
	ByID bool
	// Unsafe consumes with an inbox that records nothing, which must fail
	// the check: the torture's own test.
	Unsafe bool
	// Backlog bounds the messages published ahead of the consumers: the
	// publisher waits while more than Backlog messages are neither applied
	// nor caught (an event applied accounts for its copy too), as a
	// producer held back by a broker's flow control would. A broker with
	// millions of messages queued and restarted is another test, of the
	// broker. Defaults to 100,000; negative means no bound.
	Backlog int
	// Seed seeds the run's choices. Defaults to a random one. Either way it
	// is printed first (Progress) and in the report.
	Seed uint64
	// Timeout bounds the run's stalls once publishing has begun, not its
	// length: the run ends once no event has been applied for Timeout,
	// not counting the time the run's own restarts keep the broker down,
	// and the events not applied then are violations. A run on a slow or
	// busy machine takes as long as it keeps applying events; one that is
	// stuck ends Timeout after its last. Defaults to
	// DefaultMessagesTimeout.
	Timeout time.Duration
	// Drain is how long a run whose time is up, every event published,
	// goes on with the faults stopped, to tell the events that were slow
	// from those that were lost: the report counts the events applied
	// during the drain apart (MessagesReport.AppliedLate). They remain
	// violations, of the timeout. Defaults to DefaultMessagesDrain;
	// negative means none.
	Drain time.Duration

	// ConsumerLog receives every line the consumers log. Defaults to
	// nil: none.
	ConsumerLog io.Writer
	// Progress receives a progress line now and then. Defaults to
	// io.Discard.
	Progress      io.Writer
	ProgressEvery time.Duration
}

func (c *MessagesConfig) withDefaults() (MessagesConfig, error) {
	if c == nil {
		return MessagesConfig{}, errors.New("torture: RunMessages needs a MessagesConfig")
	}
	o := *c
	if o.WorkerArgs == nil {
		o.WorkerArgs = []string{"torture", "messages-worker"}
	}
	if o.Broker == "" {
		o.Broker = "sqlite"
	}
	if o.Events == 0 {
		o.Events = DefaultEvents
	}
	if o.Keys == 0 {
		o.Keys = DefaultEventKeys
	}
	if o.Consumers == 0 {
		o.Consumers = DefaultConsumers
	}
	if o.KillEvery == 0 {
		o.KillEvery = DefaultConsumerKillEvery
	}
	if o.AckKillRate == 0 {
		o.AckKillRate = DefaultAckKillRate
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultMessagesTimeout
	}
	if o.Backlog == 0 {
		o.Backlog = DefaultBacklog
	}
	if o.Drain == 0 {
		o.Drain = DefaultMessagesDrain
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = defaultProgressEvery
	}
	if o.Seed == 0 {
		o.Seed = randomSeed()
	}
	broker, _ := brokerKind(o.Broker)
	switch {
	case o.Executable == "":
		return o, errors.New("torture: MessagesConfig.Executable is required")
	case o.Events < 1 || o.Keys < 1 || o.Consumers < 1:
		return o, errors.New("torture: Events, Keys and Consumers must be positive")
	case o.AckKillRate >= 1:
		return o, fmt.Errorf("torture: AckKillRate must be below 1, got %g", o.AckKillRate)
	case o.AckWait < 0 || o.Timeout < 0 || o.RestartBrokerEvery < 0 || o.ChurnEvery < 0:
		return o, errors.New("torture: AckWait, Timeout, RestartBrokerEvery and ChurnEvery must not be negative")
	case broker == "":
		return o, fmt.Errorf("torture: Broker must be sqlite, postgres://…, nats://…, amqp://…, kafka://…, %s, %s, %s or %s", PrivatePostgres, PrivateNATS, PrivateRabbitMQ, PrivateKafka)
	case o.RestartBrokerEvery > 0 && o.Broker == PrivateKafka:
		return o, errors.New("torture: RestartBrokerEvery cannot restart kfake: it runs in this process and keeps nothing on disk")
	case o.RestartBrokerEvery > 0 && !strings.HasPrefix(o.Broker, "private-"):
		return o, errors.New("torture: RestartBrokerEvery needs a private broker: the run restarts only servers it started itself, never one that others share")
	case (broker == "sqlite" || broker == "pg") && o.DB != "":
		return o, errors.New("torture: DB goes with a NATS, RabbitMQ or Kafka broker; on SQLite and PostgreSQL the inbox is in the broker's database")
	}
	if o.DB == "" && (broker == "nats" || broker == "amqp" || broker == "kafka") {
		o.DB = "sqlite"
	}
	if o.DB != "" && o.DB != "sqlite" && !isPostgresURL(o.DB) {
		return o, errors.New("torture: DB must be sqlite or postgres://…")
	}
	return o, nil
}

// brokerKind is "sqlite", "pg", "nats", "amqp" or "kafka" for a Broker value, and
// the private server it needs, if any; "" for a value it does not know.
func brokerKind(b string) (kind, private string) {
	switch {
	case b == "sqlite":
		return "sqlite", ""
	case b == PrivatePostgres:
		return "pg", "postgres"
	case b == PrivateNATS:
		return "nats", "nats"
	case b == PrivateRabbitMQ:
		return "amqp", "rabbitmq"
	case b == PrivateKafka:
		return "kafka", "kafka"
	case isPostgresURL(b):
		return "pg", ""
	case strings.HasPrefix(b, "nats://"):
		return "nats", ""
	case strings.HasPrefix(b, "amqp://"), strings.HasPrefix(b, "amqps://"):
		return "amqp", ""
	case strings.HasPrefix(b, "kafka://"):
		return "kafka", ""
	}
	return "", ""
}

func isPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// printSeed says, at the start of a run, which seed it draws its choices
// from and what the seed makes again (SeedReplays).
func printSeed(w io.Writer, seed uint64) {
	fmt.Fprintf(w, "torture: seed %d (the same arguments and --seed %d %s)\n", seed, seed, SeedReplays)
}

// SeedReplays says what a run's seed, given again with the same
// arguments, makes again: the plan (the payments or messages, the
// accounts and amounts, the abandoned clients, the lost answers) and the
// faults scheduled from it (which kill, store restart or reset comes at
// which payment). Not the machine's timing (which request a replica
// answers first, how long a store or a round takes, which completer takes
// a key), which the run does not control: a failure that depends on it
// may not come again with its seed.
const SeedReplays = "draw the same plan and scheduled faults; the machine's timing is not replayed"

// NewSeed returns a random seed, as a run draws when Seed is 0: for a
// caller that shows the seed before the run starts.
func NewSeed() uint64 { return randomSeed() }

func randomSeed() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	var seed uint64
	for _, x := range b {
		seed = seed<<8 | uint64(x)
	}
	return seed | 1
}

// messagesRun is one message torture under way.
type messagesRun struct {
	cfg    MessagesConfig
	rng    *lockedRand
	spec   siteSpec
	dir    string
	site   *site
	server *localserver.Server // the private broker, if any
	kfake  *kfake.Cluster      // the private Kafka, in this process
	// dropSchema is the PostgreSQL schema to drop at the end, on a server
	// others share.
	dropSchema string
	consumers  []*replica
	log        *lineWriter
	// chaos keeps a consumer's start and a broker's restart apart: a
	// consumer that starts while its broker is down fails to subscribe.
	chaos sync.Mutex

	published atomic.Int64
	copies    atomic.Int64
	kills     atomic.Int64
	churns    atomic.Int64
	// calm is closed when the calm part of a churned run ends: calmAt
	// and calmApplied say when, and with how many events applied.
	calm        chan struct{}
	calmAt      time.Time
	calmApplied int64
	began       time.Time
	// held is what the consumers' streams said they held at most, and
	// their limit (see holding).
	heldPeak, heldLimit, heldReports atomic.Int64
	ackKills                         atomic.Int64
	// ackKillAt is the count of messages after which the first consumer to
	// process that many SIGKILLs itself, before acknowledging the last
	// (0: none scheduled); ackKillMark is the file that consumer creates
	// (workerConfig.AckKillMark). ackKillerDone says a consumer killed
	// itself between commit and ack: until then the run kills and stops
	// no consumer (victim), so that every consumer lives on until one has
	// processed ackKillAt messages, which one does however the transport
	// shares them out, and the scheduled kill is certain.
	ackKillAt     int
	ackKillMark   string
	ackKillerDone atomic.Bool
	// firstKillAt and firstRestartAt are the counts of events applied at
	// which the run's first SIGKILL of a consumer and first restart of the
	// private broker come, if their interval has not brought them sooner:
	// drawn from the seed, so that a short run meets both (see
	// drawFirstFaults).
	firstKillAt, firstRestartAt int64
	restarts                    atomic.Int64
	restarting                  atomic.Bool // while restartLoop has the broker down
	// slowRestarts counts the restarts that took over slowRestart, and
	// slowestRestart is the longest (a time.Duration): restartLoop writes
	// them, printProgress says them.
	slowRestarts, slowestRestart atomic.Int64
	applied                      atomic.Int64
	// late counts the events applied in the drain, after the time was up
	// and the faults stopped; drained says whether there was a drain.
	late       int64
	drained    bool
	violations []string
	vmu        sync.Mutex
}

func (r *messagesRun) violate(format string, args ...any) {
	r.vmu.Lock()
	defer r.vmu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

// RunMessages runs a message torture: it publishes Events events, each
// twice (the copy, half of the time, under another message ID), to
// Consumers consumer processes that compete for them and apply each in
// the inbox's transaction; it SIGKILLs consumers now and then, has them
// SIGKILL themselves between a commit and its acknowledgement, and
// restarts a private broker. Once every event is applied it waits a
// little longer, for the redeliveries of what was never acknowledged,
// then checks from the database that every event was applied exactly
// once, nothing was dead-lettered and, in sequence mode, every key's
// events were applied in order.
//
// It returns an error when the run could not be carried out (a consumer
// that does not start, a broker that does not answer); a promise that was
// broken is in the report (MessagesReport.OK).
func RunMessages(ctx context.Context, cfg *MessagesConfig) (rep *MessagesReport, err error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	printSeed(c.Progress, c.Seed)
	r := &messagesRun{cfg: c, rng: newLockedRand(c.Seed), calm: make(chan struct{})}
	if c.ChurnEvery <= 0 {
		close(r.calm)
	}
	if c.ConsumerLog != nil {
		r.log = &lineWriter{w: c.ConsumerLog}
	}
	defer func() { err = errors.Join(err, r.cleanup()) }()
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	if err := r.startConsumers(ctx); err != nil {
		return nil, err
	}
	r.drawFirstFaults()
	elapsed, err := r.load(ctx)
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("torture: interrupted before the checks: %w", context.Cause(ctx))
	}
	return r.check(ctx, elapsed)
}

// prepare makes the run's place: a temporary directory, the private
// broker, the site (the stores' tables, the effects table, the stream or
// exchange) and the consumers' subscription, so that what is published
// next is kept for them.
func (r *messagesRun) prepare(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "idem-torture-messages-")
	if err != nil {
		return fmt.Errorf("torture: %w", err)
	}
	r.dir = dir
	kind, private := brokerKind(r.cfg.Broker)
	spec := siteSpec{Broker: kind, Namespace: strings.ToLower(crand.Text()[:12])}
	if kind == "kafka" {
		// A killed consumer's partitions move when its session times out:
		// that is Kafka's ack wait. A broker refuses sessions shorter than
		// its group.min.session.timeout.ms, 6s by default; the private
		// kfake is started allowing shorter ones.
		spec.KafkaSession = r.cfg.AckWait
		if private == "" {
			spec.KafkaSession = max(r.cfg.AckWait, 6*time.Second)
		}
	}
	brokerURL := r.cfg.Broker
	if private == "kafka" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return fmt.Errorf("torture: starting kfake: %w", err)
		}
		r.kfake = c
		brokerURL = "kafka://" + strings.Join(c.ListenAddrs(), ",")
		fmt.Fprintf(r.cfg.Progress, "torture: private Kafka (kfake, in this process) at %s\n", brokerURL)
	} else if private != "" {
		start := map[string]func(context.Context, string) (*localserver.Server, error){
			"postgres": localserver.StartPostgres,
			"nats":     localserver.StartNATS,
			"rabbitmq": localserver.StartRabbitMQ,
		}[private]
		s, err := start(ctx, filepath.Join(dir, private))
		if err != nil {
			return fmt.Errorf("torture: starting a private %s: %w", private, err)
		}
		r.server = s
		brokerURL = s.URL()
		fmt.Fprintf(r.cfg.Progress, "torture: private %s in %s\n", s.Name(), dir)
	}
	switch kind {
	case "sqlite":
		spec.DB = "sqlite"
	case "pg":
		spec.DB, spec.PostgresURL = "pg", brokerURL
	default:
		spec.BrokerURL = brokerURL
		spec.DB = "sqlite"
		if isPostgresURL(r.cfg.DB) {
			spec.DB, spec.PostgresURL = "pg", r.cfg.DB
		}
	}
	if spec.DB == "sqlite" {
		spec.SQLite = filepath.Join(dir, "torture.db")
	}
	if spec.DB == "pg" && private == "" {
		r.dropSchema = spec.schema()
	}
	r.spec = spec
	s, err := openSite(ctx, spec, nil)
	if err != nil {
		return fmt.Errorf("torture: %w", err)
	}
	r.site = s
	sub, err := s.sub.Subscribe(ctx, idem.Subscription{Topic: messagesTopic, Consumer: messagesConsumer, AckWait: r.cfg.AckWait})
	if err != nil {
		return fmt.Errorf("torture: subscribing: %w", err)
	}
	if err := sub.Close(); err != nil {
		return err
	}
	if private == "rabbitmq" && r.cfg.RestartBrokerEvery > 0 {
		// RabbitMQ 3.10 registers a new quorum queue's Raft server in a
		// file it writes out lazily; SIGKILLed within seconds of the
		// declaration (the first restart may come that soon), it boots
		// without the queue's server, and the queue never has a leader
		// again: basic.consume waits forever ("leader not known") and
		// every consumer started after it never subscribes. One clean
		// restart now writes the registration out, before any crash.
		if err := r.server.Restart(ctx, false); err != nil {
			return fmt.Errorf("torture: restarting the private %s once cleanly: %w", r.server.Name(), err)
		}
	}
	return nil
}

// startConsumers starts the consumer processes, all at once. With an
// ack-kill rate, one consumer drawn from the seed also SIGKILLs itself
// after a number of messages drawn too (see workerConfig.AckKillAt), in
// each of its lives until one such kill happened: a rate alone leaves a
// short run to chance.
func (r *messagesRun) startConsumers(ctx context.Context) error {
	r.ackKillAt = 0
	if r.cfg.AckKillRate > 0 {
		dir, err := os.MkdirTemp("", "idem-torture-ackkill-")
		if err != nil {
			return fmt.Errorf("torture: %w", err)
		}
		r.ackKillMark = filepath.Join(dir, "killed")
		r.ackKillAt = 1 + r.rng.IntN(max(1, min(maxAckKillAt, r.cfg.Events/(4*r.cfg.Consumers))))
		fmt.Fprintf(r.cfg.Progress, "torture: the first consumer to process %d messages SIGKILLs itself then, before acknowledging the last\n", r.ackKillAt)
	}
	for i := range r.cfg.Consumers {
		env, err := r.workerEnv(i)
		if err != nil {
			return err
		}
		r.consumers = append(r.consumers, &replica{
			n: i, exe: r.cfg.Executable, args: r.cfg.WorkerArgs, env: env,
			what: "consumer", ready: consumingPrefix, log: r.log, onLine: func(_ int, line string) { r.holding(line) },
		})
	}
	errs := make([]error, len(r.consumers))
	var wg sync.WaitGroup
	for i, c := range r.consumers {
		wg.Go(func() { errs[i] = c.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("torture: %w", err)
	}
	return nil
}

// drawFirstFaults draws the counts of events applied at which the first
// kill and the first broker restart come, each between a tenth and half of
// the events, unless their interval brings them sooner: with the interval
// alone a run that ends before it meets none, and the run is not done
// until it has met each it was asked for (see faultsMet).
func (r *messagesRun) drawFirstFaults() {
	draw := func() int64 {
		lo := max(int64(r.cfg.Events)/10, 1)
		hi := max(int64(r.cfg.Events)/2, lo)
		return lo + r.rng.Int64N(hi-lo+1)
	}
	if r.cfg.KillEvery > 0 {
		r.firstKillAt = draw()
		after := ""
		if r.cfg.AckKillRate > 0 {
			after = ", or right after the first kill between commit and ack if that comes later"
		}
		fmt.Fprintf(r.cfg.Progress, "torture: the first SIGKILL of a consumer comes at the latest once %d events are applied%s\n", r.firstKillAt, after)
	}
	if r.cfg.RestartBrokerEvery > 0 && r.server != nil {
		r.firstRestartAt = draw()
		fmt.Fprintf(r.cfg.Progress, "torture: the first restart of the broker comes at the latest once %d events are applied\n", r.firstRestartAt)
	}
}

// faultsMet says whether the run has met the faults it was asked for: a
// SIGKILL of a consumer by the run, a restart of the private broker, and,
// with ChurnEvery, a consumer that left its group (its churns come every
// ChurnEvery once the calm part is over, with nothing drawn, so a run
// whose events were all applied before the first would meet none).
func (r *messagesRun) faultsMet() bool {
	return (r.firstKillAt == 0 || r.kills.Load() > 0) && (r.firstRestartAt == 0 || r.restarts.Load() > 0) &&
		(r.cfg.ChurnEvery <= 0 || r.churns.Load() > 0)
}

// untilFirst waits until the interval every has passed or at events are
// applied, whichever comes first; it returns false when stop or ctx ends
// first.
func (r *messagesRun) untilFirst(ctx context.Context, stop <-chan struct{}, every time.Duration, at int64) bool {
	t := time.NewTimer(every)
	defer t.Stop()
	// The run's poll counts the events applied every 250ms.
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for r.applied.Load() < at {
		select {
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-poll.C:
		}
	}
	return true
}

// untilAckKill waits until the scheduled kill between commit and ack has
// happened (at once when none is scheduled), which the run's kills wait
// for (victim): the first kill by the run comes right after it, not a
// whole KillEvery later. It returns false when stop or ctx ends first.
func (r *messagesRun) untilAckKill(ctx context.Context, stop <-chan struct{}) bool {
	if r.ackKillAt == 0 {
		return true
	}
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for !r.ackKillerDone.Load() {
		select {
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		case <-poll.C:
		}
	}
	return true
}

// maxAckKillAt bounds the scheduled ack kill's message number: a consumer
// killed by the run every few seconds still lives to reach it.
const maxAckKillAt = 50

// workerEnv is consumer i's environment, its configuration in WorkerEnv;
// ackKillAt as in workerConfig.
func (r *messagesRun) workerEnv(i int) ([]string, error) {
	wc, err := json.Marshal(workerConfig{
		N:           i,
		Site:        r.spec,
		Sequence:    !r.cfg.ByID && !r.cfg.Unsafe,
		Unsafe:      r.cfg.Unsafe,
		AckKillRate: max(r.cfg.AckKillRate, 0),
		AckKillAt:   r.ackKillAt,
		AckKillMark: r.ackKillMark,
		AckWait:     r.cfg.AckWait,
		Seed:        r.cfg.Seed + uint64(i),
	})
	if err != nil {
		return nil, err
	}
	return append(append([]string(nil), r.cfg.Env...), WorkerEnv+"="+string(wc)), nil
}

// load publishes the events and their copies, with the kills and the
// restarts going on, until every event is applied or none has been for
// Timeout;
// then, the chaos over, it waits AckWait and a little more, for the
// redeliveries of what was applied but never acknowledged. It returns the
// time from the first publication to the last event applied.
func (r *messagesRun) load(ctx context.Context) (time.Duration, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The kills and restarts stop once every event is applied; the
	// supervisors, which start a killed consumer again, only after the
	// redeliveries have had their time.
	stopChaos, stopSupervising := make(chan struct{}), make(chan struct{})
	var chaos, supervisors sync.WaitGroup
	errs := make(chan error, len(r.consumers)+3)
	for _, c := range r.consumers {
		supervisors.Go(func() { errs <- r.supervise(ctx, c, stopSupervising) })
	}
	chaos.Go(func() { errs <- r.killLoop(ctx, stopChaos) })
	chaos.Go(func() { errs <- r.restartLoop(ctx, stopChaos) })
	chaos.Go(func() { errs <- r.churnLoop(ctx, stopChaos) })
	received := 0
	// collect gathers the loops' errors once they are all told to stop.
	collect := func() error {
		var err error
		for ; received < len(r.consumers)+3; received++ {
			err = errors.Join(err, <-errs)
		}
		return err
	}

	published := make(chan error, 1)
	began := time.Now()
	r.began = began
	go func() { published <- r.publish(runCtx) }()
	var elapsed time.Duration
	var loadErr error
	progress := time.NewTicker(r.cfg.ProgressEvery)
	defer progress.Stop()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	publishing := true
	stall := newStallWatch(r.cfg.Timeout, began)
wait:
	for {
		select {
		case err := <-published:
			publishing = false
			if err != nil && runCtx.Err() == nil {
				loadErr = err
				break wait
			}
		case err := <-errs:
			// A loop with nothing to do ends at once; otherwise only a
			// consumer or a broker that does not come back ends one early.
			received++
			if err != nil {
				loadErr = err
				break wait
			}
		case <-progress.C:
			r.printProgress()
		case <-poll.C:
			r.endCalm()
			if stall.stalled(time.Now(), r.applied.Load(), r.restarting.Load()) {
				break wait
			}
			if publishing {
				// Done means every event and every copy published, too.
				r.countApplied(runCtx)
				continue
			}
			done, err := r.allApplied(runCtx)
			if err != nil {
				// The database may be the broker being restarted.
				continue
			}
			if done && r.faultsMet() {
				elapsed = time.Since(began)
				break wait
			}
		case <-runCtx.Done():
			break wait
		}
	}
	timedOut := elapsed == 0 && loadErr == nil && ctx.Err() == nil
	if elapsed == 0 {
		elapsed = time.Since(began)
	}
	cancel()
	if publishing {
		if err := <-published; err != nil && loadErr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			loadErr = err
		}
	}
	close(stopChaos)
	chaos.Wait()
	if timedOut {
		at := r.applied.Load()
		if !publishing && r.cfg.Drain > 0 {
			r.drain(ctx)
			r.drained, r.late = true, max(r.applied.Load()-at, 0)
		}
		r.violate("%s", timeUp(r.cfg.Timeout, r.cfg.Drain, r.cfg.Events, at, r.late, r.drained))
	}
	if loadErr != nil {
		close(stopSupervising)
		supervisors.Wait()
		return 0, errors.Join(loadErr, collect())
	}
	// What a consumer applied and did not acknowledge comes back once
	// AckWait has passed, and must be caught as a duplicate.
	grace := time.NewTimer(r.cfg.AckWait + 2*time.Second)
	defer grace.Stop()
	select {
	case <-grace.C:
	case <-ctx.Done():
	}
	close(stopSupervising)
	supervisors.Wait()
	if err := collect(); err != nil {
		return 0, err
	}
	r.printProgress()
	return elapsed, nil
}

// timeUp words the violation of a run that went timeout without an event
// applied, with at of
// events applied, and, when it drained, late more applied in the drain:
// those were slow, the rest lost.
// slowRestart is how long a broker's restart may take before the progress
// lines say so: RabbitMQ boots in seconds on a quiet machine.
const slowRestart = 10 * time.Second

// stallWatch tells a stalled run from a slow one. It reports a stall once
// no event has been applied for its timeout, not counting the time the
// run's own restart keeps the broker down: no event can be applied then,
// and a restart is bounded on its own (the server's ready timeout,
// RabbitMQ's three minutes, longer than a stall's minute in CI, fails the
// run), so a busy machine's slow boot is neither a stall nor hidden.
type stallWatch struct {
	timeout time.Duration
	applied int64
	moved   time.Time
}

func newStallWatch(timeout time.Duration, began time.Time) *stallWatch {
	return &stallWatch{timeout: timeout, moved: began}
}

// stalled takes the time, the events applied so far and whether the broker
// is being restarted, and says whether the run has stalled.
func (w *stallWatch) stalled(now time.Time, applied int64, restarting bool) bool {
	if applied > w.applied || restarting {
		w.applied = max(w.applied, applied)
		w.moved = now
		return false
	}
	return now.Sub(w.moved) > w.timeout
}

func timeUp(timeout, drain time.Duration, events int, at, late int64, drained bool) string {
	switch left := int64(events) - at - late; {
	case !drained:
		return fmt.Sprintf("no event was applied for %s (the timeout), with %d of %d applied", timeout, at, events)
	case left <= 0:
		return fmt.Sprintf("no event was applied for %s (the timeout), with %d of %d applied; with the faults stopped the other %d were applied within %s: slow, not lost",
			timeout, at, events, late, drain)
	default:
		return fmt.Sprintf("no event was applied for %s (the timeout), with %d of %d applied; with the faults stopped %d more were applied within %s, and %d never were",
			timeout, at, events, late, drain, left)
	}
}

// drain waits, the faults stopped and the consumers still supervised,
// until every event is applied or Drain has passed.
func (r *messagesRun) drain(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Drain)
	defer cancel()
	fmt.Fprintf(r.cfg.Progress, "torture: the time is up with %d of %d events applied; the faults stopped, waiting up to %s for the rest\n",
		r.applied.Load(), r.cfg.Events, r.cfg.Drain)
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	progress := time.NewTicker(r.cfg.ProgressEvery)
	defer progress.Stop()
	for {
		if done, err := r.allApplied(ctx); err == nil && done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-progress.C:
			r.printProgress()
		case <-poll.C:
		}
	}
}

// publish publishes every event in batches, each batch followed by the
// copies of the one before, so that a copy comes after its original. A
// batch that fails (a broker restarting) is published again, whole: the
// copies that makes are caught as the rest are.
func (r *messagesRun) publish(ctx context.Context) error {
	n := r.cfg.Events
	send := func(msgs []idem.Message) error {
		var delay time.Duration
		since := time.Now()
		for failures := 0; ; failures++ {
			pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := r.site.pub.Publish(pctx, msgs...)
			cancel()
			if err == nil {
				r.published.Add(int64(len(msgs)))
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if time.Since(since) > publishPatience {
				return fmt.Errorf("torture: publishing failed for %s, %d times in a row: %w", publishPatience, failures+1, err)
			}
			delay = workerRetry.Delay(failures+1, delay)
			if !sleepCtx(ctx, delay) {
				return ctx.Err()
			}
		}
	}
	batch := func(from int, copies bool) []idem.Message {
		msgs := make([]idem.Message, 0, publishBatch)
		for i := from; i < min(from+publishBatch, n); i++ {
			msgs = append(msgs, eventMessage(i, r.cfg.Keys, copies && i%2 == 1))
		}
		return msgs
	}
	for from := 0; from < n; from += publishBatch {
		if !r.waitBacklog(ctx) {
			return ctx.Err()
		}
		if err := send(batch(from, false)); err != nil {
			return err
		}
		if from > 0 {
			msgs := batch(from-publishBatch, true)
			if err := send(msgs); err != nil {
				return err
			}
			r.copies.Add(int64(len(msgs)))
		}
	}
	last := (n - 1) / publishBatch * publishBatch
	msgs := batch(last, true)
	if err := send(msgs); err != nil {
		return err
	}
	r.copies.Add(int64(len(msgs)))
	return nil
}

// waitBacklog waits while more than Backlog messages published are not
// yet consumed, by the count of effects the run's poll keeps; it returns
// false when ctx ends first.
func (r *messagesRun) waitBacklog(ctx context.Context) bool {
	if r.cfg.Backlog < 0 {
		return true
	}
	for r.published.Load()-2*r.applied.Load() > int64(r.cfg.Backlog) {
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return false
		}
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// countApplied counts the effects, for the progress lines.
func (r *messagesRun) countApplied(ctx context.Context) (int64, error) {
	var n int64
	if err := r.site.query(ctx, `SELECT count(*) FROM torture_effects`, &n); err != nil {
		return 0, err
	}
	r.applied.Store(n)
	return n, nil
}

// allApplied reports whether every event has an effect: the count of
// effects first, which is cheap, then of distinct events.
func (r *messagesRun) allApplied(ctx context.Context) (bool, error) {
	n, err := r.countApplied(ctx)
	if err != nil {
		return false, err
	}
	if n < int64(r.cfg.Events) {
		return false, nil
	}
	var distinct int64
	if err := r.site.query(ctx, `SELECT count(DISTINCT event) FROM torture_effects`, &distinct); err != nil {
		return false, err
	}
	return distinct >= int64(r.cfg.Events), nil
}

// supervise starts c again whenever it exits: after the run killed it, or
// after it killed itself between a commit and its acknowledgement. Any
// other exit is a violation: a consumer ends only when told to.
func (r *messagesRun) supervise(ctx context.Context, c *replica, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		case <-c.exited():
		}
		byRun, exit := c.ended()
		if !byRun {
			var ee *exec.ExitError
			if errors.As(exit, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
					r.ackKills.Add(1)
					byRun = true
					if r.ackKillMark != "" && !r.ackKillerDone.Load() {
						// The scheduled kill (or one at the rate) has
						// happened: the rate alone from now on. The
						// mark ends the scheduled one in every consumer.
						if f, err := os.OpenFile(r.ackKillMark, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
							_ = f.Close()
						}
					}
					r.ackKillerDone.Store(true)
				}
			}
			if !byRun {
				r.violate("%s exited by itself (%v): %s", c.name(), exit, c.lastLines())
			}
		}
		select {
		case <-stop:
			return nil
		default:
		}
		// Each try holds off the kills and the broker's restarts, but not
		// the time between two: a broker that cannot serve the consumer's
		// queue until it boots again (RabbitMQ 3.10, SIGKILLed every few
		// seconds, now and then answers basic.consume with INTERNAL_ERROR
		// for a queue until its next boot) gets that restart before the
		// next try, where holding the lock through every try waited for it
		// in vain.
		var err error
		for range 3 {
			r.chaos.Lock()
			err = c.start(ctx)
			r.chaos.Unlock()
			if err == nil || ctx.Err() != nil {
				break
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("torture: starting again: %w", err)
		}
	}
}

// killLoop SIGKILLs a random consumer every KillEvery; supervise starts it
// again.
func (r *messagesRun) killLoop(ctx context.Context, stop <-chan struct{}) error {
	if r.cfg.KillEvery < 0 {
		return nil
	}
	select {
	case <-r.calm:
	case <-stop:
		return nil
	case <-ctx.Done():
		return nil
	}
	if !r.untilFirst(ctx, stop, r.cfg.KillEvery, r.firstKillAt) || !r.untilAckKill(ctx, stop) {
		return nil
	}
	t := time.NewTicker(r.cfg.KillEvery)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-stop:
				return nil
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
		r.chaos.Lock()
		if c := r.victim(); c != nil {
			c.kill()
			r.kills.Add(1)
		}
		r.chaos.Unlock()
	}
}

// victim draws the consumer the run kills or stops next: any, once the
// scheduled ack kill has happened (or when there is none); before, none
// (this tick passes). A run that killed the consumer meant to kill itself
// met, now and then, no kill between commit and ack at all: each of its
// lives was cut before its message ackKillAt; and one that spared a
// consumer drawn up front met none when the transport gave that consumer
// fewer than ackKillAt messages in the whole run (the SQLite transport's
// busy consumers take nearly all). With every consumer alive until then,
// the first to process ackKillAt messages kills itself, and one does.
func (r *messagesRun) victim() *replica {
	if r.ackKillAt == 0 || r.ackKillerDone.Load() {
		return r.consumers[r.rng.IntN(len(r.consumers))]
	}
	return nil
}

// restartLoop SIGKILLs the private broker every RestartBrokerEvery and
// starts it again.
func (r *messagesRun) restartLoop(ctx context.Context, stop <-chan struct{}) error {
	if r.cfg.RestartBrokerEvery <= 0 || r.server == nil {
		return nil
	}
	// The interval runs from the end of one restart, however long it took
	// (RabbitMQ boots in seconds), so the broker serves between two.
	if !r.untilFirst(ctx, stop, r.cfg.RestartBrokerEvery, r.firstRestartAt) {
		return nil
	}
	t := time.NewTimer(r.cfg.RestartBrokerEvery)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-stop:
				return nil
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
		r.chaos.Lock()
		r.restarting.Store(true)
		began := time.Now()
		err := r.server.Restart(ctx, true)
		took := time.Since(began)
		r.restarting.Store(false)
		t.Reset(r.cfg.RestartBrokerEvery)
		r.chaos.Unlock()
		if took > slowRestart {
			// Said by the next progress line: Progress is written by the
			// load's goroutine alone.
			r.slowRestarts.Add(1)
			if took > time.Duration(r.slowestRestart.Load()) {
				r.slowestRestart.Store(int64(took))
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("torture: restarting the private %s: %w", r.server.Name(), err)
		}
		r.restarts.Add(1)
	}
}

func (r *messagesRun) printProgress() {
	slow := ""
	if n := r.slowRestarts.Load(); n > 0 {
		slow = fmt.Sprintf(" (%d took over %s, the longest %s, not counted against the timeout)",
			n, slowRestart, time.Duration(r.slowestRestart.Load()).Round(time.Millisecond))
	}
	fmt.Fprintf(r.cfg.Progress, "torture: %d/%d events applied, %d messages published, %d kills, %d killed between commit and ack, %d broker restarts%s\n",
		r.applied.Load(), r.cfg.Events, r.published.Load(), r.kills.Load(), r.ackKills.Load(), r.restarts.Load(), slow)
}

// cleanup stops every consumer and deletes what the run made: the
// stream, or exchange and queues, the PostgreSQL schema, the temporary
// directory; a private broker is stopped, and goes with the directory.
func (r *messagesRun) cleanup() error {
	var wg sync.WaitGroup
	for _, c := range r.consumers {
		wg.Go(c.stop)
	}
	wg.Wait()
	if r.ackKillMark != "" {
		_ = os.RemoveAll(filepath.Dir(r.ackKillMark))
	}
	ctx, cancel := context.WithTimeout(context.Background(), phaseTimeout)
	defer cancel()
	var errs []error
	if r.site != nil {
		if r.server == nil {
			if err := r.site.forget(ctx); err != nil {
				errs = append(errs, fmt.Errorf("torture: %w", err))
			}
		}
		r.site.close()
	}
	if r.dropSchema != "" {
		errs = append(errs, dropSchema(ctx, r.spec.PostgresURL, r.dropSchema))
	}
	if r.kfake != nil {
		r.kfake.Close()
	}
	if r.server != nil {
		if err := r.server.Close(); err != nil {
			errs = append(errs, fmt.Errorf("torture: stopping the private %s: %w", r.server.Name(), err))
		}
	}
	if r.dir != "" {
		if err := os.RemoveAll(r.dir); err != nil {
			errs = append(errs, fmt.Errorf("torture: removing %s: %w", r.dir, err))
		}
	}
	return errors.Join(errs...)
}

// endCalm ends the calm part of a churned run once a fifth of the events
// are applied.
func (r *messagesRun) endCalm() {
	select {
	case <-r.calm:
		return
	default:
	}
	if n := r.applied.Load(); n >= int64(r.cfg.Events)/5 {
		r.calmAt, r.calmApplied = time.Now(), n
		close(r.calm)
		fmt.Fprintf(r.cfg.Progress, "torture: calm part over (%d events applied in %s); the churn begins\n", n, time.Since(r.began).Round(time.Millisecond))
	}
}

// churnLoop has a random consumer leave its group every ChurnEvery: a
// clean stop (SIGTERM), after which supervise starts it again at once,
// and it joins again.
func (r *messagesRun) churnLoop(ctx context.Context, stop <-chan struct{}) error {
	if r.cfg.ChurnEvery <= 0 {
		return nil
	}
	select {
	case <-r.calm:
	case <-stop:
		return nil
	case <-ctx.Done():
		return nil
	}
	t := time.NewTicker(r.cfg.ChurnEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r.chaos.Lock()
		if c := r.victim(); c != nil {
			c.stop()
			r.churns.Add(1)
		}
		r.chaos.Unlock()
	}
}

// heldPrefix starts the line a consumer prints now and then with what
// its transport's streams hold (holdingEvery).
const heldPrefix = "idem: stream holds "

// holding reads a consumer's line, keeping the most its streams held and
// their limit: held beyond the limit is a violation.
func (r *messagesRun) holding(line string) {
	rest, ok := strings.CutPrefix(line, heldPrefix)
	if !ok {
		return
	}
	var held, peak, limit, bytes int64
	if _, err := fmt.Sscanf(rest, "%d peak %d limit %d bytes %d", &held, &peak, &limit, &bytes); err != nil {
		return
	}
	r.heldReports.Add(1)
	for _, v := range []struct {
		a *atomic.Int64
		n int64
	}{{&r.heldPeak, peak}, {&r.heldLimit, limit}} {
		for {
			cur := v.a.Load()
			if v.n <= cur || v.a.CompareAndSwap(cur, v.n) {
				break
			}
		}
	}
	if peak > limit || held > limit {
		r.violate("a consumer's streams held %d messages (peak %d) above their limit of %d", held, peak, limit)
	}
}
