package idemamqp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/bits"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/secreturl"
)

// Header names the transport reserves. Names beginning with "x-" belong
// to RabbitMQ (x-delivery-count, x-death) and are reserved too.
const (
	// HeaderKey carries Message.Key.
	HeaderKey = "Idem-Key"
	// HeaderTime carries Message.Time in RFC 3339 with nanoseconds; the
	// AMQP timestamp property holds only seconds.
	HeaderTime = "Idem-Time"
	// HeaderTopic carries the topic of a delayed copy, whose routing key
	// became its queue's name on the way back.
	HeaderTopic = "Idem-Topic"
	// HeaderAttempts carries, on a delayed copy, how many deliveries the
	// message had before the copy was made.
	HeaderAttempts = "Idem-Attempts"
	// headerDeliveryCount is the quorum queue's count of earlier
	// deliveries of a message.
	headerDeliveryCount = "x-delivery-count"
	// headerDeath is RabbitMQ's record of a message's dead-letterings,
	// most recent first, one entry per queue and reason.
	headerDeath = "x-death"
)

// Queue arguments and the values the transport gives them.
const (
	argDeliveryLimit         = "x-delivery-limit"
	argDeadLetterExchange    = "x-dead-letter-exchange"
	argDeadLetterRoutingKey  = "x-dead-letter-routing-key"
	argDeadLetterStrategy    = "x-dead-letter-strategy"
	deadLetterAtLeastOnce    = "at-least-once"
	deathReasonDeliveryLimit = "delivery_limit"
	// brokerDeliveryLimit is the delivery limit RabbitMQ 4.0 and later give
	// a quorum queue that sets none.
	brokerDeliveryLimit = 20
	// limitQueueDeliveryLimit is the delivery limit of "<queue>.limit",
	// beyond reach, so that RabbitMQ 4's default does not apply to it: it
	// has nowhere to send a message further (see limitQueueArgs).
	limitQueueDeliveryLimit = math.MaxInt32
)

var (
	// ErrUnroutable is returned by Publish when the exchange routed a
	// message to no queue: no consumer has subscribed to its topic yet,
	// and RabbitMQ would have dropped it.
	ErrUnroutable = errors.New("idemamqp: unroutable: no queue is bound to the topic")
	// ErrNacked is returned by Publish when the broker refused a message
	// (a publisher-confirm nack), or the channel closed before it
	// answered: the message may or may not be stored.
	ErrNacked = errors.New("idemamqp: the broker did not confirm the message")
	// ErrStaleDelivery is returned by a Delivery's methods once it has
	// been settled.
	ErrStaleDelivery = errors.New("idemamqp: delivery already settled")
)

// Config configures a Transport. The zero value is ready to use.
type Config struct {
	// Exchange is the durable topic exchange messages are published to,
	// with the topic as routing key. Defaults to "idem".
	Exchange string
	// QueuePrefix names a consumer's queue: "<QueuePrefix>.<consumer>".
	// Defaults to "idem".
	QueuePrefix string
	// ClassicQueues makes consumers' queues classic queues instead of
	// quorum queues. Classic queues do not count deliveries, so Attempt
	// is then only a lower bound, and have no delivery limit, so they
	// have no limit queue either. Defaults to false: quorum queues.
	ClassicQueues bool
	// DeliveryLimit is the x-delivery-limit of consumers' quorum queues:
	// the returns to the queue a message may have before RabbitMQ gives it
	// up and dead-letters it to "<queue>.limit", from which the
	// subscription delivers it, counted as exhausted (see the package
	// documentation). Classic queues have no delivery limit. Defaults to
	// 0: not set, which is unlimited on RabbitMQ 3.x and 20 on RabbitMQ
	// 4.0 and later (or what a policy says).
	DeliveryLimit int
	// MaxInFlight is the prefetch (basic.qos) of subscriptions that leave
	// Subscription.MaxInFlight zero: room for a batch being handled, the
	// next one waiting in the client and more on the way. A quorum queue
	// counts a delivery in x-delivery-count even when it only reached the
	// client's buffer before its stream closed, so a larger prefetch
	// raises more counts at each restart. Defaults to 300, three of the
	// consumer package's batches of 100.
	MaxInFlight int
	// PublishWindow bounds the messages of one Publish call sent and
	// awaiting their publisher confirms: Publish sends that many ahead
	// before it waits for the oldest confirm. Defaults to 256.
	PublishWindow int
	// Mandatory publishes with the mandatory flag, so that Publish returns
	// ErrUnroutable for a message no queue is bound to, instead of
	// RabbitMQ dropping it. A relay then holds such a message until a
	// consumer has subscribed to its topic, and, since an outbox relays
	// in order, the messages behind it too. Defaults to false: dropped, as
	// AMQP specifies.
	Mandatory bool
	// Clock dates messages published without a Time. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
	// Logger receives the Warnings as they are found, at level Warn.
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Exchange == "" {
		cfg.Exchange = "idem"
	}
	if cfg.QueuePrefix == "" {
		cfg.QueuePrefix = "idem"
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 300
	}
	if cfg.PublishWindow == 0 {
		cfg.PublishWindow = 256
	}
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case strings.HasPrefix(cfg.Exchange, "amq."):
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config.Exchange", Reason: `must not begin with "amq."`}
	case strings.HasPrefix(cfg.QueuePrefix, "amq."):
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config.QueuePrefix", Reason: `must not begin with "amq."`}
	case len(cfg.Exchange) > 255 || len(cfg.QueuePrefix) > 200:
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config", Reason: "names must fit in 255 bytes"}
	case cfg.DeliveryLimit < 0, cfg.MaxInFlight < 0, cfg.PublishWindow < 0:
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config", Reason: "counts must not be negative"}
	}
	return cfg, nil
}

// Transport is an idem.Publisher and idem.Subscriber over RabbitMQ. See the
// package documentation for what it guarantees.
type Transport struct {
	url string
	cfg Config

	mu     sync.Mutex
	closed bool
	conn   *amqp.Connection
	// streams are the open streams, closed with the Transport.
	streams map[*stream]struct{}
	// queues are the queues this Transport declared, for DeleteQueues.
	queues map[string]bool
	// warnings are what Warnings returns, one per queue at most.
	warnings []*Warning

	// pubMu serialises publishing, so that a Publish call's messages
	// leave in order and their confirms and returns are its own.
	pubMu sync.Mutex
	pub   *pubChannel
}

var (
	_ idem.Publisher   = (*Transport)(nil)
	_ idem.Subscriber  = (*Transport)(nil)
	_ idem.BatchStream = (*stream)(nil)
)

// Open connects to RabbitMQ at url and declares the exchange. cfg may be
// nil. The Transport dials again when it finds its connection closed.
func Open(ctx context.Context, url string, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Transport{url: url, cfg: c, streams: make(map[*stream]struct{}), queues: make(map[string]bool)}
	ch, err := t.channel(ctx)
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(c.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		_ = t.Close()
		return nil, fmt.Errorf("idemamqp: declare exchange %q: %w", c.Exchange, err)
	}
	return t, nil
}

// channel opens a channel, dialling when the connection is missing or
// closed.
func (t *Transport) channel(ctx context.Context) (*amqp.Channel, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, idem.ErrClosed
	}
	if t.conn == nil || t.conn.IsClosed() {
		cfg := amqp.Config{Properties: amqp.NewConnectionProperties()}
		cfg.Properties.SetClientConnectionName("idem")
		if dl, ok := ctx.Deadline(); ok {
			cfg.Dial = amqp.DefaultDial(time.Until(dl))
		}
		conn, err := amqp.DialConfig(t.url, cfg)
		if err != nil {
			// amqp091 quotes a URL it cannot parse, password and all.
			return nil, fmt.Errorf("idemamqp: dial: %w", secreturl.Scrub(err, t.url))
		}
		t.conn = conn
	}
	ch, err := t.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("idemamqp: open a channel: %w", err)
	}
	return ch, nil
}

// Close closes every stream and the connection, and makes Publish and
// Subscribe return idem.ErrClosed. Closing twice is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	streams := t.streams
	t.streams = nil
	conn := t.conn
	t.mu.Unlock()
	for s := range streams {
		_ = s.Close()
	}
	t.pubMu.Lock()
	if t.pub != nil {
		_ = t.pub.ch.Close()
		t.pub = nil
	}
	t.pubMu.Unlock()
	if conn != nil && !conn.IsClosed() {
		if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("idemamqp: close: %w", err)
		}
	}
	return nil
}

// pubChannel is the channel Publish uses, in confirm mode.
type pubChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
}

// publisher returns the publishing channel, opening it if needed.
// t.pubMu is held.
func (t *Transport) publisher(ctx context.Context) (*pubChannel, error) {
	if t.pub != nil && !t.pub.ch.IsClosed() {
		return t.pub, nil
	}
	t.pub = nil
	ch, err := t.channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("idemamqp: confirm mode: %w", err)
	}
	// The returns buffer holds twice the messages awaiting confirms, and
	// publish drains it after each confirm, so the library, which blocks
	// on a full one, never has to wait.
	t.pub = &pubChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 2*t.cfg.PublishWindow))}
	return t.pub, nil
}

// dropPublisher discards the publishing channel after a failure, so that
// late confirms and returns cannot be taken for the next call's.
// t.pubMu is held.
func (t *Transport) dropPublisher() {
	if t.pub != nil {
		_ = t.pub.ch.Close()
		t.pub = nil
	}
}

// outgoing is one message ready to publish.
type outgoing struct {
	id         string
	mandatory  bool
	exchange   string
	routingKey string
	pub        amqp.Publishing
}

// Publish implements idem.Publisher: each message goes to the exchange
// with its topic as routing key, persistent, with its ID as
// message_id, on a channel in confirm mode. Publish returns nil once the
// broker has confirmed every message, which for a durable queue means it
// has stored it (for a quorum queue, on a majority of its replicas). The
// messages of one call are pipelined in order on one channel, up to
// Config.PublishWindow of them awaiting their confirms at once; should
// the broker refuse one, later ones of the call may have been stored, so
// a retried call can deliver them out of order (consumers de-duplicate).
//
// Returns an error matching idem.ErrInvalidArgument, having published
// nothing, when a message does not validate or a header cannot travel (see
// the package documentation); ErrUnroutable, with Config.Mandatory, when
// no queue is bound to a message's topic; ErrNacked when the broker did not confirm one;
// idem.ErrClosed after Close.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	now := t.cfg.Clock.Now()
	out := make([]outgoing, len(msgs))
	for i, m := range msgs {
		p, err := toPublishing(m, now)
		if err != nil {
			return err
		}
		out[i] = outgoing{id: m.ID, mandatory: t.cfg.Mandatory, exchange: t.cfg.Exchange, routingKey: m.Topic, pub: p}
	}
	return t.publish(ctx, out)
}

// publish sends out and waits for its confirms, keeping up to
// Config.PublishWindow of them outstanding.
func (t *Transport) publish(ctx context.Context, out []outgoing) error {
	if len(out) == 0 {
		return nil
	}
	t.pubMu.Lock()
	defer t.pubMu.Unlock()
	pc, err := t.publisher(ctx)
	if err != nil {
		return err
	}
	ids := make(map[string]bool, len(out))
	for _, o := range out {
		ids[o.id] = true
	}
	var unroutable []string
	// takeReturns collects the returns that have arrived. RabbitMQ sends
	// a mandatory message's basic.return before its basic.ack, and the
	// library hands the return over before it resolves the confirm, so
	// once a message is confirmed its return, if any, is here.
	takeReturns := func() error {
		for {
			select {
			case r, ok := <-pc.returns:
				if !ok {
					t.dropPublisher()
					return fmt.Errorf("idemamqp: publish: channel closed: %w", ErrNacked)
				}
				if ids[r.MessageId] {
					unroutable = append(unroutable, fmt.Sprintf("%q to %q", r.MessageId, r.RoutingKey))
				}
			default:
				return nil
			}
		}
	}
	confirms := make([]*amqp.DeferredConfirmation, len(out))
	await := func(i int) error {
		ok, err := confirms[i].WaitContext(ctx)
		confirms[i] = nil
		if err != nil {
			t.dropPublisher()
			return fmt.Errorf("idemamqp: publish %q: waiting for its confirm: %w", out[i].id, err)
		}
		if !ok {
			t.dropPublisher()
			return fmt.Errorf("idemamqp: publish %q: %w", out[i].id, ErrNacked)
		}
		return takeReturns()
	}
	oldest := 0
	for i, o := range out {
		if i-oldest == t.cfg.PublishWindow {
			if err := await(oldest); err != nil {
				return err
			}
			oldest++
		}
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, o.exchange, o.routingKey, o.mandatory, false, o.pub)
		if err != nil {
			t.dropPublisher()
			return fmt.Errorf("idemamqp: publish %q: %w", o.id, err)
		}
		confirms[i] = dc
	}
	for ; oldest < len(out); oldest++ {
		if err := await(oldest); err != nil {
			return err
		}
	}
	if len(unroutable) > 0 {
		return fmt.Errorf("idemamqp: publish %s: %w", strings.Join(unroutable, ", "), ErrUnroutable)
	}
	return nil
}

// toPublishing converts m, copying what it keeps.
func toPublishing(m idem.Message, now time.Time) (amqp.Publishing, error) {
	if err := m.Validate(); err != nil {
		return amqp.Publishing{}, err
	}
	if len(m.Topic) > 255 {
		return amqp.Publishing{}, &idem.ArgumentError{Field: "Message.Topic", Reason: "an AMQP routing key must fit in 255 bytes"}
	}
	if len(m.ID) > 255 {
		return amqp.Publishing{}, &idem.ArgumentError{Field: "Message.ID", Reason: "an AMQP message_id must fit in 255 bytes"}
	}
	h := amqp.Table{}
	for k, v := range m.Headers {
		if err := checkHeader(k); err != nil {
			return amqp.Publishing{}, err
		}
		h[k] = v
	}
	if m.Key != "" {
		h[HeaderKey] = m.Key
	}
	at := m.Time
	if at.IsZero() {
		at = now
	}
	h[HeaderTime] = at.UTC().Format(time.RFC3339Nano)
	return amqp.Publishing{
		Headers:      h,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    at,
		Body:         append([]byte(nil), m.Payload...),
	}, nil
}

// reserved reports whether a header belongs to the broker or the
// transport rather than to the message.
func reserved(name string) bool {
	if strings.HasPrefix(name, "x-") {
		return true
	}
	for _, r := range []string{HeaderKey, HeaderTime, HeaderTopic, HeaderAttempts} {
		if strings.EqualFold(name, r) {
			return true
		}
	}
	return false
}

func checkHeader(name string) error {
	field := fmt.Sprintf("Message.Headers[%q]", name)
	switch {
	case name == "" || len(name) > 255:
		return &idem.ArgumentError{Field: field, Reason: "an AMQP header name must be 1 to 255 bytes"}
	case reserved(name):
		return &idem.ArgumentError{Field: field, Reason: `the name is reserved ("x-…", ` + HeaderKey + ", " + HeaderTime + ", " + HeaderTopic + ", " + HeaderAttempts + ")"}
	}
	return nil
}

// Queue returns the name of consumer's queue.
func (t *Transport) Queue(consumer string) string { return t.cfg.QueuePrefix + "." + consumer }

// limitQueue names the queue that holds the messages queue gave up past
// its delivery limit.
func limitQueue(queue string) string { return queue + ".limit" }

// queueArgs returns the arguments of the consumer's queue named queue.
// A quorum queue dead-letters, at least once, to limitQueue(queue)
// through the default exchange: whatever delivery limit applies (the
// configured one, RabbitMQ 4's default, a policy's), a message past it is
// kept there rather than dropped. At-least-once dead-lettering needs
// overflow reject-publish (with drop-head RabbitMQ falls back to at most
// once), so a queue at a length limit set by a policy refuses a new
// message (Publish returns ErrNacked) instead of dropping its oldest.
func (t *Transport) queueArgs(queue string) amqp.Table {
	args := t.legacyQueueArgs()
	if t.cfg.ClassicQueues {
		return args
	}
	args[argDeadLetterExchange] = ""
	args[argDeadLetterRoutingKey] = limitQueue(queue)
	args[argDeadLetterStrategy] = deadLetterAtLeastOnce
	args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	return args
}

// legacyQueueArgs returns the arguments the earlier versions of the
// transport gave a consumer's queue, without a dead-letter target.
func (t *Transport) legacyQueueArgs() amqp.Table {
	if t.cfg.ClassicQueues {
		return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}
	}
	args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if t.cfg.DeliveryLimit > 0 {
		args[argDeliveryLimit] = int64(t.cfg.DeliveryLimit)
	}
	return args
}

// limitQueueArgs returns the arguments of a "<queue>.limit" queue. It has
// no dead-letter target of its own: RabbitMQ drops a message
// dead-lettered round a cycle without a rejection in it (back to the
// queue, or to itself), so its delivery limit is set beyond reach
// instead, which overrides RabbitMQ 4's default. Overflow reject-publish
// keeps, should a policy give it a length limit, the messages it cannot
// take in the queue that gives them up, rather than dropping its oldest.
func limitQueueArgs() amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:     amqp.QueueTypeQuorum,
		argDeliveryLimit:      int64(limitQueueDeliveryLimit),
		amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish,
	}
}

// declareQueue declares the consumer's queue on ch and returns the channel
// to go on with: another one when the broker closed ch by refusing the
// declaration; on an error, it has closed the channels. A queue an earlier
// version declared has no dead-letter target, and arguments cannot change
// on an existing queue (RabbitMQ answers PRECONDITION_FAILED and closes
// the channel): such a queue is declared passively instead, checked
// against the arguments that version gave it (so that another queue type
// or delivery limit is still refused), and reported in Warnings. Should
// the queue be deleted between the two declarations, the second creates
// it as that version did, still reported.
func (t *Transport) declareQueue(ctx context.Context, ch *amqp.Channel, queue string) (*amqp.Channel, error) {
	_, err := ch.QueueDeclare(queue, true, false, false, false, t.queueArgs(queue))
	if err == nil {
		return ch, nil
	}
	if !lacksDeadLetterTarget(err) {
		_ = ch.Close()
		return nil, err
	}
	refusal := err
	// The refusal closed the channel, as a failed declaration does.
	_ = ch.Close()
	if ch, err = t.channel(ctx); err != nil {
		return nil, err
	}
	if _, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, t.legacyQueueArgs())
	}
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("%w; and as declared without one: %w", refusal, err)
	}
	t.warn(ctx, &Warning{Queue: queue, Problem: ErrNoDeadLetterTarget, Fix: limitPolicyCommand(queue)})
	return ch, nil
}

// lacksDeadLetterTarget reports whether err is RabbitMQ's refusal to
// declare a queue with the dead-letter arguments because the existing
// queue has none of them: "PRECONDITION_FAILED - inequivalent arg
// 'x-dead-letter-exchange' for queue ... but current is none".
func lacksDeadLetterTarget(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.HasSuffix(ae.Reason, "but current is none") {
		return false
	}
	for _, arg := range []string{argDeadLetterExchange, argDeadLetterRoutingKey, argDeadLetterStrategy, amqp.QueueOverflowArg} {
		if strings.Contains(ae.Reason, "inequivalent arg '"+arg+"'") {
			return true
		}
	}
	return false
}

// limitPolicyCommand returns the rabbitmqctl command that gives queue,
// declared without a dead-letter target, the one the transport declares.
func limitPolicyCommand(queue string) string {
	def, _ := json.Marshal(map[string]string{
		"dead-letter-exchange":    "",
		"dead-letter-routing-key": limitQueue(queue),
		"dead-letter-strategy":    deadLetterAtLeastOnce,
		"overflow":                amqp.QueueOverflowRejectPublish,
	})
	return "rabbitmqctl set_policy " + shellQuote(limitQueue(queue)) + " " +
		shellQuote("^"+regexp.QuoteMeta(queue)+"$") + " " + shellQuote(string(def)) + " --apply-to queues"
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// ErrNoDeadLetterTarget is the Problem of a Warning about a quorum queue
// declared without a dead-letter target, by an earlier version of the
// transport: RabbitMQ drops a message past its delivery limit (20 by
// default from RabbitMQ 4.0), where the transport's own queues keep it.
var ErrNoDeadLetterTarget = errors.New("idemamqp: the queue has no dead-letter target: RabbitMQ drops a message past its delivery limit (20 by default from RabbitMQ 4.0)")

// A Warning is a setting found on the broker that can drop a message the
// consumer has not settled. The transport goes on working; the setting
// wants an operator.
type Warning struct {
	// Queue is the queue the setting is on.
	Queue string
	// Problem says what can happen; errors.Is matches it against the
	// package's sentinels (ErrNoDeadLetterTarget).
	Problem error
	// Fix is a command that mends it.
	Fix string
}

func (w *Warning) Error() string {
	return fmt.Sprintf("idemamqp: queue %q: %s; to fix it: %s", w.Queue, strings.TrimPrefix(w.Problem.Error(), "idemamqp: "), w.Fix)
}

func (w *Warning) Unwrap() error { return w.Problem }

// warn records w, once per queue and problem, and logs it.
func (t *Transport) warn(ctx context.Context, w *Warning) {
	t.mu.Lock()
	for _, seen := range t.warnings {
		if seen.Queue == w.Queue && seen.Problem == w.Problem {
			t.mu.Unlock()
			return
		}
	}
	t.warnings = append(t.warnings, w)
	t.mu.Unlock()
	t.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "RabbitMQ queue can drop messages",
		slog.String("queue", w.Queue), slog.String("problem", w.Problem.Error()), slog.String("fix", w.Fix))
}

// Warnings returns the settings found on the broker, as the Transport
// declared its queues, that can drop a message no consumer has settled,
// in the order found, each once: so far, a consumer's quorum queue that an
// earlier version declared without a dead-letter target
// (ErrNoDeadLetterTarget). Subscribe finds them, so call it after the
// subscriptions are made; Config.Logger receives each as it is found.
func (t *Transport) Warnings() []*Warning {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Warning, len(t.warnings))
	for i, w := range t.warnings {
		c := *w
		out[i] = &c
	}
	return out
}

func (t *Transport) noteQueue(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queues[name] = true
}

// DeleteQueues deletes the queues this Transport has declared (consumers'
// queues, their limit queues and their delay queues), with the messages in
// them. It is for tests and for retiring consumers.
func (t *Transport) DeleteQueues(ctx context.Context) error {
	t.mu.Lock()
	names := make([]string, 0, len(t.queues))
	for q := range t.queues {
		names = append(names, q)
	}
	t.mu.Unlock()
	ch, err := t.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range names {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("idemamqp: delete queue %q: %w", q, err)
		}
		t.mu.Lock()
		delete(t.queues, q)
		t.mu.Unlock()
	}
	return nil
}

// Subscribe implements idem.Subscriber: it declares the consumer's durable
// queue, "<QueuePrefix>.<consumer>" (a quorum queue unless
// ClassicQueues), binds it to the exchange with the topic as binding key
// (so '*' and '#' match as in any topic exchange), sets the prefetch to
// sub.MaxInFlight (at most 65,535, the most AMQP can say) and starts
// consuming with manual acknowledgement. A quorum queue's limit queue,
// "<queue>.limit", where RabbitMQ dead-letters the messages it gives up
// past the delivery limit, is declared first and consumed on the same
// channel (see the package documentation). A queue an earlier version
// declared without that dead-letter target is used as it is and reported
// in Warnings.
// Messages published before the queue first existed were not routed to
// it. RabbitMQ has no per-delivery ack deadline: sub.AckWait is not used.
//
// Returns an error matching idem.ErrInvalidArgument when sub has no Topic
// or Consumer, a name too long for AMQP, or a negative AckWait or
// MaxInFlight; idem.ErrClosed after Close.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	if err := sub.Validate(); err != nil {
		return nil, err
	}
	switch {
	case len(sub.Topic) > 255:
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "an AMQP binding key must fit in 255 bytes"}
	case len(t.delayQueue(t.Queue(sub.Consumer), time.Hour*24*365)) > 255:
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "too long for an AMQP queue name"}
	}
	if sub.MaxInFlight == 0 {
		sub.MaxInFlight = t.cfg.MaxInFlight
	}
	s := &stream{t: t, sub: sub, queue: t.Queue(sub.Consumer), done: make(chan struct{})}
	if err := s.startRetrying(ctx); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = s.gen.ch.Close()
		return nil, idem.ErrClosed
	}
	t.streams[s] = struct{}{}
	return s, nil
}

// startAttempts bounds how often Subscribe sets a stream up when the
// broker fails it with an internal error (see brokerHiccup).
const startAttempts = 4

// brokerHiccup reports a failure of the broker itself, not of the
// subscription: RabbitMQ answers a consume on a quorum queue whose process
// has not started yet (just declared, on a loaded broker) with
// INTERNAL_ERROR, which closes the whole connection, so any subscription
// being set up on it fails too. Setting up again on a new connection
// works.
func brokerHiccup(err error) bool {
	if errors.Is(err, amqp.ErrClosed) {
		return true // the connection that failed is gone
	}
	var ae *amqp.Error
	return errors.As(err, &ae) && (ae.Code == amqp.InternalError || ae.Code == amqp.ConnectionForced)
}

type stream struct {
	t     *Transport
	sub   idem.Subscription
	queue string

	// mu guards gen, which start replaces after the channel died.
	mu  sync.Mutex
	gen *channelGen

	closeOnce sync.Once
	done      chan struct{}
}

// maxPrefetch is the largest prefetch AMQP can say (a short), and
// maxBuffered the most deliveries a stream holds ready to hand out beside
// the library's own buffer.
const (
	maxPrefetch = 1<<16 - 1
	maxBuffered = 1024
)

// channelGen is one AMQP channel of a stream, and the deliveries it
// brought.
type channelGen struct {
	ch *amqp.Channel
	// buffered holds the channel's deliveries as they arrive, so that
	// NextBatch can take at once those already there; it is closed when
	// the channel's deliveries end.
	buffered chan *amqp.Delivery

	// settleMu is held while a settlement of the channel is sent and
	// recorded, so that an ack with multiple set, which settles every
	// unsettled delivery of the channel up to its tag, covers exactly the
	// deliveries it is meant to.
	settleMu sync.Mutex
	// unsettled holds the tags of the channel's deliveries not settled,
	// handed out or not: no more than the prefetch of each queue.
	unsettled map[uint64]struct{}
	// received is the lowest delivery tag not recorded yet, and ahead the
	// tags above it recorded already. The channel numbers its deliveries
	// 1, 2, 3... across its consumers, but those of one consumer can be
	// recorded before a lower tag of the other's: no ack with multiple
	// set may reach a tag not recorded, which nobody has seen.
	received uint64
	ahead    map[uint64]struct{}
}

// forward moves the deliveries of sources, the channel's consumers, into
// g.buffered, recording each as unsettled first, until they end or the
// stream closes; g.buffered is closed once every source has ended. A
// source that ends alone (the broker cancelled its consumer: its queue was
// deleted) closes the channel, so that the stream subscribes anew and
// declares the queues again, as it does when the channel dies.
func (g *channelGen) forward(sources []<-chan amqp.Delivery, done <-chan struct{}) {
	var wg sync.WaitGroup
	for _, deliveries := range sources {
		wg.Go(func() {
			defer func() { _ = g.ch.Close() }()
			for d := range deliveries {
				g.record(d.DeliveryTag)
				select {
				case g.buffered <- &d:
				case <-done:
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(g.buffered)
	}()
}

// record notes tag as delivered and not settled.
func (g *channelGen) record(tag uint64) {
	g.settleMu.Lock()
	defer g.settleMu.Unlock()
	g.unsettled[tag] = struct{}{}
	if tag != g.received {
		g.ahead[tag] = struct{}{}
		return
	}
	g.received++
	for {
		if _, ok := g.ahead[g.received]; !ok {
			return
		}
		delete(g.ahead, g.received)
		g.received++
	}
}

// settle sends one settlement of tag with fn and records it.
func (g *channelGen) settle(tag uint64, fn func() error) error {
	g.settleMu.Lock()
	defer g.settleMu.Unlock()
	if err := fn(); err != nil {
		return err
	}
	delete(g.unsettled, tag)
	return nil
}

// ackAll acknowledges ds, deliveries of g: with one basic.ack with
// multiple set for those below the lowest unsettled tag not among them,
// when there are several, and one basic.ack each for the others. It
// reports which it acknowledged.
func (g *channelGen) ackAll(ds []*delivery) ([]bool, error) {
	acked := make([]bool, len(ds))
	g.settleMu.Lock()
	defer g.settleMu.Unlock()
	mine := make(map[uint64]bool, len(ds))
	for _, d := range ds {
		mine[d.d.DeliveryTag] = true
	}
	if top := multipleUpTo(g.unsettled, mine, g.received); top > 0 {
		if err := g.ch.Ack(top, true); err != nil {
			return acked, err
		}
		for i, d := range ds {
			if tag := d.d.DeliveryTag; tag <= top {
				acked[i] = true
				delete(g.unsettled, tag)
			}
		}
	}
	for i, d := range ds {
		if acked[i] {
			continue
		}
		tag := d.d.DeliveryTag
		if err := g.ch.Ack(tag, false); err != nil {
			return acked, err
		}
		acked[i] = true
		delete(g.unsettled, tag)
	}
	return acked, nil
}

// multipleUpTo returns the tag up to which an ack with multiple set
// settles exactly tags of mine: the highest of mine below the lowest
// unsettled tag not of mine and below received, the lowest tag not
// recorded yet, when at least two of mine are below them; otherwise 0,
// and one ack each is as few frames.
func multipleUpTo(unsettled map[uint64]struct{}, mine map[uint64]bool, received uint64) uint64 {
	other := received
	for tag := range unsettled {
		if !mine[tag] && tag < other {
			other = tag
		}
	}
	var top uint64
	covered := 0
	for tag := range mine {
		if tag < other {
			covered++
			top = max(top, tag)
		}
	}
	if covered < 2 {
		return 0
	}
	return top
}

// start declares and binds the queue and starts consuming on a new
// channel.
func (s *stream) start(ctx context.Context) error {
	ch, err := s.t.channel(ctx)
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		_ = ch.Close()
		return fmt.Errorf("idemamqp: subscribe %q: %s: %w", s.sub.Consumer, what, err)
	}
	// Quorum queues: the queue a message given up past the delivery limit
	// goes to exists before the queue that sends it there.
	queues := []string{s.queue}
	if !s.t.cfg.ClassicQueues {
		limit := limitQueue(s.queue)
		if _, err := ch.QueueDeclare(limit, true, false, false, false, limitQueueArgs()); err != nil {
			return fail("declare queue "+limit, err)
		}
		s.t.noteQueue(limit)
		queues = append(queues, limit)
	}
	if ch, err = s.t.declareQueue(ctx, ch, s.queue); err != nil {
		return fmt.Errorf("idemamqp: subscribe %q: declare queue %s: %w", s.sub.Consumer, s.queue, err)
	}
	s.t.noteQueue(s.queue)
	if err := ch.QueueBind(s.queue, s.sub.Topic, s.t.cfg.Exchange, false, nil); err != nil {
		return fail("bind queue "+s.queue, err)
	}
	prefetch := min(s.sub.MaxInFlight, maxPrefetch)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fail("qos", err)
	}
	// Consume, not ConsumeWithContext: the consumer outlives the context
	// of the call that started it, and a cancel racing Close would
	// confuse the channel's replies. The limit queue is consumed on the
	// same channel, with the same prefetch, and its deliveries are handed
	// out with the others.
	var sources []<-chan amqp.Delivery
	for _, q := range queues {
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			return fail("consume "+q, err)
		}
		sources = append(sources, deliveries)
	}
	gen := &channelGen{
		ch:        ch,
		buffered:  make(chan *amqp.Delivery, min(prefetch, maxBuffered)),
		unsettled: make(map[uint64]struct{}),
		received:  1,
		ahead:     make(map[uint64]struct{}),
	}
	gen.forward(sources, s.done)
	s.mu.Lock()
	s.gen = gen
	s.mu.Unlock()
	return nil
}

// startRetrying is start, set up again on a new connection (after 50ms,
// then 100ms, then 150ms) when the broker failed it (brokerHiccup).
func (s *stream) startRetrying(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := s.start(ctx)
		if err == nil || attempt == startAttempts || !brokerHiccup(err) {
			return err
		}
		wait := time.NewTimer(time.Duration(attempt) * 50 * time.Millisecond)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return errors.Join(err, ctx.Err())
		}
	}
}

// Next implements idem.Stream. When the channel or the connection died,
// Next subscribes again once (dialling again if needed); the broker has
// put the messages the old channel held back in the queue.
func (s *stream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.take(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

// NextBatch implements idem.BatchStream: it waits for a delivery as Next
// does, then takes the others the broker has already sent (within the
// prefetch), up to max, without waiting for more. Returns an
// *idem.ArgumentError when max is below 1.
func (s *stream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	return s.take(ctx, max)
}

// AcksInTx implements idem.BatchStream: a broker cannot join a database
// transaction.
func (s *stream) AcksInTx(context.Context) bool { return false }

// take waits for a delivery and takes up to max of those there.
func (s *stream) take(ctx context.Context, max int) ([]idem.Delivery, error) {
	restarted := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-s.done:
			return nil, idem.ErrClosed
		default:
		}
		s.mu.Lock()
		gen := s.gen
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, idem.ErrClosed
		case d, ok := <-gen.buffered:
			if ok {
				ds := []idem.Delivery{s.handOut(gen, d)}
				for len(ds) < max {
					select {
					case d, ok := <-gen.buffered:
						if ok {
							ds = append(ds, s.handOut(gen, d))
							continue
						}
					default:
					}
					break
				}
				return ds, nil
			}
		}
		// The deliveries ended: the stream was closed, or the AMQP
		// channel died.
		select {
		case <-s.done:
			return nil, idem.ErrClosed
		default:
		}
		if restarted {
			return nil, fmt.Errorf("idemamqp: next: the channel closed again after subscribing anew: %w", amqp.ErrClosed)
		}
		restarted = true
		if err := s.startRetrying(ctx); err != nil {
			return nil, fmt.Errorf("idemamqp: next: the channel closed, subscribing anew: %w", err)
		}
	}
}

func (s *stream) handOut(gen *channelGen, d *amqp.Delivery) idem.Delivery {
	dd := s.delivery(*d)
	dd.gen = gen
	return dd
}

// AckBatch implements idem.BatchStream with as few frames as it can: the
// deliveries of ds on one channel that are all its unsettled deliveries
// up to a delivery tag (handed out or waiting in the client) take one
// basic.ack with multiple set, for that tag; the others one basic.ack
// each. basic.ack has no answer: as Ack, AckBatch returns once the frames
// are written. Deliveries settled already, and those of a channel that
// has died (whose messages the broker put back in the queue, to be
// delivered again), are passed over. Deliveries of another stream are
// refused with an error matching idem.ErrInvalidArgument.
func (s *stream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	own := make([]*delivery, len(ds))
	for i, d := range ds {
		ad, ok := d.(*delivery)
		if !ok || ad.s != s {
			return 0, &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		own[i] = ad
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var gens []*channelGen
	byGen := make(map[*channelGen][]*delivery)
	for _, d := range own {
		if d.gen.ch.IsClosed() || d.claim("ack") != nil {
			continue
		}
		if byGen[d.gen] == nil {
			gens = append(gens, d.gen)
		}
		byGen[d.gen] = append(byGen[d.gen], d)
	}
	n := 0
	var errs []error
	for _, gen := range gens {
		group := byGen[gen]
		acked, err := gen.ackAll(group)
		for i, d := range group {
			d.release(acked[i])
			if acked[i] {
				n++
			}
		}
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			// A channel that died meanwhile put its messages back: its
			// deliveries are passed over, like those found dead above.
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("idemamqp: ack: %w", errors.Join(errs...))
	}
	return n, nil
}

// Close implements idem.Stream: closing the channel makes the broker put
// the messages it holds unsettled back in the queue at once.
func (s *stream) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.mu.Lock()
		gen := s.gen
		s.mu.Unlock()
		if gen != nil {
			_ = gen.ch.Close()
		}
		s.t.mu.Lock()
		delete(s.t.streams, s)
		s.t.mu.Unlock()
	})
	return nil
}

func (s *stream) delivery(d amqp.Delivery) *delivery {
	m := idem.Message{ID: d.MessageId, Topic: d.RoutingKey, Time: d.Timestamp, Payload: d.Body}
	prior := 0
	for k, v := range d.Headers {
		switch k {
		case HeaderKey:
			m.Key = headerString(v)
			continue
		case HeaderTime:
			if tm, err := time.Parse(time.RFC3339Nano, headerString(v)); err == nil {
				m.Time = tm
			}
			continue
		case HeaderTopic:
			m.Topic = headerString(v)
			continue
		case HeaderAttempts:
			prior, _ = strconv.Atoi(headerString(v))
			continue
		}
		if reserved(k) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[k] = headerString(v)
	}
	attempt := prior + 1
	if n, ok := headerInt(d.Headers[headerDeliveryCount]); ok {
		attempt += n
	} else if d.Redelivered && s.t.cfg.ClassicQueues {
		// A classic queue only says the message was delivered before.
		attempt++
	}
	topic, givenUp := s.deaths(d.Headers[headerDeath])
	if _, ok := d.Headers[HeaderTopic]; !ok && topic != "" {
		m.Topic = topic
	}
	if givenUp > 0 {
		// The count of the queue that gave the message up does not travel
		// with it: it had every delivery its limit allows.
		limit := s.t.cfg.DeliveryLimit
		if limit == 0 {
			limit = brokerDeliveryLimit
		}
		attempt += givenUp * (limit + 1)
	}
	return &delivery{s: s, d: d, m: m, attempt: attempt}
}

// deaths reads the x-death header of a message dead-lettered from the
// consumer's queue into its limit queue: the topic it was routed by, and
// how many times the queue gave it up past its delivery limit.
func (s *stream) deaths(v any) (topic string, givenUp int) {
	entries, _ := v.([]any)
	for _, e := range entries {
		death, ok := e.(amqp.Table)
		if !ok || headerString(death["queue"]) != s.queue {
			continue
		}
		if keys, _ := death["routing-keys"].([]any); len(keys) > 0 && topic == "" {
			topic = headerString(keys[0])
		}
		if headerString(death["reason"]) == deathReasonDeliveryLimit {
			n, _ := headerInt(death["count"])
			givenUp += max(n, 1)
		}
	}
	return topic, givenUp
}

func headerString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func headerInt(v any) (int, bool) {
	switch v := v.(type) {
	case int64:
		return int(v), true
	case int32:
		return int(v), true
	case int16:
		return int(v), true
	case int8:
		return int(v), true
	case int:
		return v, true
	case uint8:
		return int(v), true
	case uint16:
		return int(v), true
	case uint32:
		return int(v), true
	}
	return 0, false
}

// deliveryState is where a delivery is in its settlement.
type deliveryState int

const (
	open deliveryState = iota
	// settling: an Ack, Nack, Term or AckBatch is under way.
	settling
	settled
)

type delivery struct {
	s *stream
	// gen is the channel the delivery came on, which alone can settle it.
	gen     *channelGen
	d       amqp.Delivery
	m       idem.Message
	attempt int

	mu    sync.Mutex
	state deliveryState
}

// Message implements idem.Delivery.
func (d *delivery) Message() idem.Message {
	m := d.m
	m.Headers = maps.Clone(m.Headers)
	m.Payload = append([]byte(nil), m.Payload...)
	return m
}

// Attempt implements idem.Delivery: on a quorum queue, 1 + the queue's
// x-delivery-count + the deliveries before a delayed copy was made + the
// deliveries the queue's limit allowed, for a message it gave up to
// "<queue>.limit".
func (d *delivery) Attempt() int { return d.attempt }

// Ack implements idem.Delivery with basic.ack.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func() error { return d.d.Ack(false) })
}

// Term implements idem.Delivery with basic.ack: the message leaves the
// queue for good. Not basic.reject without requeue: a quorum queue
// dead-letters a rejected message to "<queue>.limit", which would deliver
// it again, and the consumer that gives a message up has put it in idem's
// dead letters already.
func (d *delivery) Term(ctx context.Context) error {
	return d.settle(ctx, "term", func() error { return d.d.Ack(false) })
}

// Nack implements idem.Delivery. With no delay, basic.reject with
// requeue=true puts the message back at once. With a delay, RabbitMQ has
// nothing per message: a copy goes to a delay queue whose TTL is the
// delay rounded up, from which the broker dead-letters it back into the
// consumer's queue, and then the original is acknowledged. See the package
// documentation for the guarantees.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if delay <= 0 {
		// basic.reject rather than basic.nack: from RabbitMQ 4.3 only
		// the former counts in x-delivery-count.
		return d.settle(ctx, "nack", func() error { return d.d.Reject(true) })
	}
	return d.settleAfter(ctx, "nack", func() error { return d.delayCopy(ctx, delay) }, func() error { return d.d.Ack(false) })
}

// InProgress implements idem.Delivery as a no-op: RabbitMQ has no ack
// deadline to extend. Its consumer_timeout (30 minutes by default)
// closes a channel that holds a delivery longer.
func (d *delivery) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == settled {
		return fmt.Errorf("idemamqp: in progress: message %q: %w", d.m.ID, ErrStaleDelivery)
	}
	return nil
}

// claim starts settling d, or returns ErrStaleDelivery when d is settled
// or being settled.
func (d *delivery) claim(op string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != open {
		return fmt.Errorf("idemamqp: %s: message %q: %w", op, d.m.ID, ErrStaleDelivery)
	}
	d.state = settling
	return nil
}

// release ends what claim started: d is settled, or open again after a
// failure.
func (d *delivery) release(done bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if done {
		d.state = settled
	} else {
		d.state = open
	}
}

// settle settles d with fn, one frame on its channel.
func (d *delivery) settle(ctx context.Context, op string, fn func() error) error {
	return d.settleAfter(ctx, op, nil, fn)
}

// settleAfter runs before, when not nil, then settles d with fn.
func (d *delivery) settleAfter(ctx context.Context, op string, before, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.claim(op); err != nil {
		return err
	}
	var err error
	if before != nil {
		err = before()
	}
	if err == nil {
		err = d.gen.settle(d.d.DeliveryTag, fn)
	}
	d.release(err == nil)
	if err != nil {
		return fmt.Errorf("idemamqp: %s: message %q: %w", op, d.m.ID, err)
	}
	return nil
}

// delayCopy publishes a copy of the message to the delay queue of the
// consumer for delay, and waits for its confirm.
func (d *delivery) delayCopy(ctx context.Context, delay time.Duration) error {
	t := d.s.t
	ms := delayBucket(delay)
	q := t.delayQueue(d.s.queue, ms)
	ch, err := t.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	// Declared on every use: a queue's x-expires counts from its last
	// declaration, so the queue outlives the copy's TTL.
	args := amqp.Table{
		amqp.QueueMessageTTLArg:     ms.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": d.s.queue,
		amqp.QueueTTLArg:            (2*ms + 10*time.Minute).Milliseconds(),
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-dead-letter-strategy":    "at-least-once",
		amqp.QueueOverflowArg:       amqp.QueueOverflowRejectPublish,
	}
	if t.cfg.ClassicQueues {
		args[amqp.QueueTypeArg] = amqp.QueueTypeClassic
		delete(args, "x-dead-letter-strategy")
		delete(args, amqp.QueueOverflowArg)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare delay queue %q: %w", q, err)
	}
	t.noteQueue(q)
	h := amqp.Table{}
	for k, v := range d.d.Headers {
		if !strings.HasPrefix(k, "x-") {
			h[k] = v
		}
	}
	h[HeaderTopic] = d.m.Topic
	h[HeaderAttempts] = strconv.Itoa(d.attempt)
	if _, ok := h[HeaderTime]; !ok {
		h[HeaderTime] = d.m.Time.UTC().Format(time.RFC3339Nano)
	}
	return t.publish(ctx, []outgoing{{
		id:         d.m.ID,
		mandatory:  true,
		exchange:   "",
		routingKey: q,
		pub: amqp.Publishing{
			Headers:      h,
			DeliveryMode: amqp.Persistent,
			MessageId:    d.d.MessageId,
			Timestamp:    d.d.Timestamp,
			ContentType:  d.d.ContentType,
			Body:         d.d.Body,
		},
	}})
}

// delayQueue names the queue that holds queue's copies for delay.
func (t *Transport) delayQueue(queue string, delay time.Duration) string {
	return queue + ".delay." + strconv.FormatInt(delay.Milliseconds(), 10)
}

// delayBucket rounds delay up to whole milliseconds with at most five
// significant bits, so it comes back no sooner, at most 1/16 later, and
// delays share a few dozen queues per consumer instead of one each.
func delayBucket(delay time.Duration) time.Duration {
	ms := uint64((delay + time.Millisecond - 1) / time.Millisecond)
	if ms == 0 {
		ms = 1
	}
	if shift := bits.Len64(ms) - 5; shift > 0 {
		step := uint64(1) << shift
		ms = (ms + step - 1) &^ (step - 1)
	}
	return time.Duration(ms) * time.Millisecond
}
