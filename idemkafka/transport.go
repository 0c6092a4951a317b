package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka/internal/stream"
)

// Header names the transport reserves in every record it publishes. A
// message whose own headers use one of them is refused, so that a
// delivered message's headers are exactly the published ones.
const (
	// HeaderID carries Message.ID: the inbox de-duplicates by it, so the
	// copy a producer retry wrote (or a relay that published twice) is
	// absorbed.
	HeaderID = stream.HeaderID
)

// ErrStaleDelivery is returned by a Delivery's Ack, Nack, Term and
// InProgress once it no longer stands for its record: it was settled
// already, or its partition was taken away (a rebalance that did not wait
// for it past Config.RevokeWait, a lost session), and the record goes to
// the partition's next owner. The inbox absorbs that owner's copy if the
// effect committed here. It matches idem.ErrStaleDelivery.
var ErrStaleDelivery = stream.ErrStaleDelivery

// Config configures a Transport. The zero value is the default.
type Config struct {
	// Clock stamps published messages that carry no Time, and times Nack
	// delays. Defaults to idem.SystemClock.
	Clock idem.Clock
	// Partitions is the partition count of the topics the transport
	// creates. Per-key order is per-partition order, so more partitions
	// let more keys flow at once. Defaults to 8.
	Partitions int32
	// ReplicationFactor of the topics the transport creates. Defaults to
	// -1, the broker's default.replication.factor.
	ReplicationFactor int16
	// TopicPrefix is put before every topic's name on Kafka, so that
	// services (or test runs) sharing a cluster keep apart; delivered
	// messages carry the topic without it. Defaults to none.
	TopicPrefix string
	// ManualTopics stops the transport from creating the topics it finds
	// missing: publishing to one, or subscribing to one, then fails.
	ManualTopics bool
	// CommitInterval is how often a stream commits the offsets its settled
	// deliveries allow. Acks never wait for a commit: the inbox already
	// holds what a commit would protect, and commits in batches cost one
	// round trip per interval instead of one per message. A crash loses at
	// most this interval's commits, which come back as redeliveries the
	// inbox absorbs. Defaults to 200ms.
	CommitInterval time.Duration
	// RevokeWait is how long a stream whose partitions a rebalance takes
	// away waits for the deliveries of those partitions it handed out to
	// be settled, so that it commits them before the next owner starts.
	// What is still unsettled then is given back: the next owner gets it
	// again. Defaults to 10s.
	RevokeWait time.Duration
	// SessionTimeout is how long the group coordinator waits for a
	// consumer's heartbeat before it gives the consumer's partitions to
	// the others. Defaults to 45s, Kafka's own default.
	SessionTimeout time.Duration
	// MaxInFlight bounds the unsettled deliveries of a stream when the
	// Subscription does not. Defaults to 1,000.
	MaxInFlight int
	// RetryHorizon is how long a message may still be in use after it was
	// published: retried, held behind its key, or waiting in a stopped
	// consumer. A topic whose retention.ms is shorter is reported (see
	// Warnings). Defaults to 7 days.
	RetryHorizon time.Duration
	// Logger receives the warnings about the topics' settings. Defaults to
	// a logger that discards.
	Logger *slog.Logger
	// ClientOptions are added to every franz-go client the transport opens
	// (TLS, SASL, client ID, a Dialer, fetch sizes, ProducerLinger). The
	// options the transport's guarantees rest on are its own and applied
	// after these, so that none of these can undo them: the seed brokers,
	// the publisher's acks=all, and a stream's consumer group, topic,
	// starting offset (the oldest record), read_committed isolation,
	// disabled autocommit, session, heartbeat and rebalance timeouts (set
	// with the fields above), and rebalance callbacks. Open refuses
	// kgo.BlockRebalanceOnPoll and kgo.AdjustFetchOffsetsFn, which a
	// stream cannot honour.
	ClientOptions []kgo.Opt
}

func (c *Config) withDefaults() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 8
	}
	if cfg.ReplicationFactor == 0 {
		cfg.ReplicationFactor = -1
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = 200 * time.Millisecond
	}
	if cfg.RevokeWait == 0 {
		cfg.RevokeWait = 10 * time.Second
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 45 * time.Second
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1000
	}
	if cfg.RetryHorizon == 0 {
		cfg.RetryHorizon = 7 * 24 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch {
	case cfg.Partitions < 0:
		return cfg, &idem.ArgumentError{Field: "Config.Partitions", Reason: "must not be negative"}
	case cfg.ReplicationFactor < -1:
		return cfg, &idem.ArgumentError{Field: "Config.ReplicationFactor", Reason: "must be -1 or positive"}
	case cfg.CommitInterval < 0, cfg.RevokeWait < 0, cfg.SessionTimeout < 0, cfg.RetryHorizon < 0:
		return cfg, &idem.ArgumentError{Field: "Config", Reason: "durations must not be negative"}
	case cfg.MaxInFlight < 0:
		return cfg, &idem.ArgumentError{Field: "Config.MaxInFlight", Reason: "must not be negative"}
	}
	return cfg, nil
}

// Transport is an idem.Publisher and idem.Subscriber on Kafka. It is safe
// for concurrent use.
type Transport struct {
	cfg   Config
	seeds []string
	// cl publishes, with the idempotent producer and acks=all, and answers
	// the admin requests.
	cl  *kgo.Client
	adm *kadm.Client

	mu     sync.Mutex
	known  map[string]bool // topics found or created
	closed bool
	// streams are the open streams of each consumer group, and
	// groupCounters what their commits met, for StreamStats.
	streams       map[string]map[*stream.Stream]bool
	groupCounters map[string]*stream.Counters
}

var _ interface {
	idem.Publisher
	idem.Subscriber
} = (*Transport)(nil)

// Open connects to the brokers seeds names ("HOST:PORT" each) and returns
// a Transport. It fails when no broker answers.
func Open(ctx context.Context, seeds []string, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(seeds) == 0 {
		return nil, &idem.ArgumentError{Field: "seeds", Reason: "must name at least one broker"}
	}
	// The transport's own options come after c.ClientOptions, which
	// cannot undo them (franz-go applies options in order).
	opts := append(append([]kgo.Opt{kgo.ProducerLinger(time.Millisecond)}, c.ClientOptions...),
		kgo.SeedBrokers(seeds...),
		// franz-go's default, stated because the guarantee rests on it:
		// a record is acknowledged once every in-sync replica has it
		// (and the idempotent producer writes a retried batch once).
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: %w", err)
	}
	if err := checkClientOptions(cl); err != nil {
		cl.Close()
		return nil, err
	}
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("idemkafka: no broker answers at %s: %w", strings.Join(seeds, ","), err)
	}
	return &Transport{cfg: c, seeds: seeds, cl: cl, adm: kadm.NewClient(cl), known: make(map[string]bool),
		streams: make(map[string]map[*stream.Stream]bool), groupCounters: make(map[string]*stream.Counters)}, nil
}

// Close closes the publishing client. Streams are closed on their own.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.cl.Close()
	return nil
}

// checkClientOptions refuses what Config.ClientOptions ask of franz-go
// that a stream cannot honour, read back from cl, which was made with
// them: the transport's own options come after them and win, but these
// have no counterpart the transport could set.
func checkClientOptions(cl *kgo.Client) error {
	if block, _ := cl.OptValue(kgo.BlockRebalanceOnPoll).(bool); block {
		return &idem.ArgumentError{Field: "Config.ClientOptions",
			Reason: "kgo.BlockRebalanceOnPoll would hold every rebalance for good: a stream never calls AllowRebalance, it finishes or gives back a revoked partition's records itself"}
	}
	type adjustFn = func(context.Context, map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error)
	if fn, _ := cl.OptValue(kgo.AdjustFetchOffsetsFn).(adjustFn); fn != nil {
		return &idem.ArgumentError{Field: "Config.ClientOptions",
			Reason: "kgo.AdjustFetchOffsetsFn could start a partition past its committed offset and skip records: a stream starts where the group committed"}
	}
	return nil
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// checkTopic refuses a topic Kafka cannot hold: legal characters are
// ASCII letters, digits, '.', '_' and '-', at most 249 of them.
func checkTopic(field, topic string) error {
	if topic == "." || topic == ".." || len(topic) > 249 {
		return &idem.ArgumentError{Field: field, Reason: fmt.Sprintf("%q is not a Kafka topic name", topic)}
	}
	for _, r := range topic {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return &idem.ArgumentError{Field: field, Reason: fmt.Sprintf("%q: a Kafka topic holds only letters, digits, '.', '_' and '-'", topic)}
		}
	}
	return nil
}

// EnsureTopics makes sure the topics exist before anything is published
// or consumed, as Publish and Subscribe do on their first use of a topic:
// those missing are created (unless Config.ManualTopics), and the
// settings of each that can lose messages are logged (see Warnings). A
// service calls it at start, so that its topics can be checked before the
// first message.
func (t *Transport) EnsureTopics(ctx context.Context, topics ...string) error {
	if t.isClosed() {
		return idem.ErrClosed
	}
	for _, topic := range topics {
		if err := checkTopic("topics", t.cfg.TopicPrefix+topic); err != nil {
			return err
		}
		if err := t.ensureTopic(ctx, topic); err != nil {
			return err
		}
	}
	return nil
}

// ensureTopic creates topic (an idem topic, without Config.TopicPrefix)
// unless it is known to exist, and logs its warnings the first time the
// transport meets it.
func (t *Transport) ensureTopic(ctx context.Context, topic string) error {
	t.mu.Lock()
	known := t.known[topic]
	t.mu.Unlock()
	if known {
		return nil
	}
	if !t.cfg.ManualTopics {
		res, err := t.adm.CreateTopic(ctx, t.cfg.Partitions, t.cfg.ReplicationFactor, nil, t.cfg.TopicPrefix+topic)
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("idemkafka: creating topic %q: %w", topic, err)
		}
		if res.Err != nil && !errors.Is(res.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("idemkafka: creating topic %q: %w", topic, res.Err)
		}
	}
	ws, err := t.Warnings(ctx, topic)
	if err != nil {
		return err
	}
	for _, w := range ws {
		t.cfg.Logger.Warn("a Kafka topic's setting can lose messages", "topic", w.Topic, "setting", w.Setting, "value", w.Value, "meaning", w.Meaning)
	}
	t.mu.Lock()
	t.known[topic] = true
	t.mu.Unlock()
	return nil
}

// Publish sends msgs with the idempotent producer (acks=all), in one
// batch per partition, and returns once every broker holding them has
// acknowledged them all. A message's Key is the record's key, so every
// message of a key goes to one partition, in order. An error means some
// may have been written: publishing again is safe, the inbox absorbs the
// copies by their ID.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	if t.isClosed() {
		return idem.ErrClosed
	}
	for i, m := range msgs {
		if err := m.Validate(); err != nil {
			return err
		}
		if err := checkTopic("Message.Topic", t.cfg.TopicPrefix+m.Topic); err != nil {
			return err
		}
		if _, ok := m.Headers[HeaderID]; ok {
			return &idem.ArgumentError{Field: fmt.Sprintf("msgs[%d].Headers", i), Reason: "header " + HeaderID + " is the transport's own"}
		}
	}
	recs := make([]*kgo.Record, 0, len(msgs))
	for _, m := range msgs {
		if err := t.ensureTopic(ctx, m.Topic); err != nil {
			return err
		}
		recs = append(recs, t.record(m))
	}
	if err := t.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		if errors.Is(err, kgo.ErrClientClosed) {
			return idem.ErrClosed
		}
		return fmt.Errorf("idemkafka: publishing: %w", err)
	}
	return nil
}

// record copies m into a record, so that the caller may change m after.
func (t *Transport) record(m idem.Message) *kgo.Record {
	r := &kgo.Record{Topic: t.cfg.TopicPrefix + m.Topic, Value: append([]byte(nil), m.Payload...)}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	r.Timestamp = m.Time
	if r.Timestamp.IsZero() {
		r.Timestamp = t.cfg.Clock.Now()
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderID, Value: []byte(m.ID)})
	for k, v := range m.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return r
}

// ParseURL returns the seed brokers of a kafka://HOST:PORT[,HOST:PORT…]
// URL, or of a bare HOST:PORT[,HOST:PORT…] list.
func ParseURL(raw string) ([]string, error) {
	rest := raw
	if scheme, after, ok := strings.Cut(raw, "://"); ok {
		if !strings.EqualFold(scheme, "kafka") {
			return nil, &idem.ArgumentError{Field: "url", Reason: fmt.Sprintf("scheme %q: want kafka://", scheme)}
		}
		rest = after
	}
	rest = strings.TrimSuffix(rest, "/")
	var seeds []string
	for _, hp := range strings.Split(rest, ",") {
		host, port, ok := strings.Cut(strings.TrimSpace(hp), ":")
		if strings.LastIndex(hp, "]:") > 0 { // [IPv6]:PORT
			i := strings.LastIndex(hp, "]:")
			host, port, ok = hp[:i+1], hp[i+2:], true
		}
		if !ok || host == "" || port == "" || strings.ContainsAny(port, ":/@?") {
			return nil, &idem.ArgumentError{Field: "url", Reason: fmt.Sprintf("%q: want HOST:PORT", hp)}
		}
		seeds = append(seeds, host+":"+port)
	}
	return seeds, nil
}
