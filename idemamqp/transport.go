package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
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
	// is then only a lower bound. Defaults to false: quorum queues.
	ClassicQueues bool
	// DeliveryLimit is the quorum queues' x-delivery-limit: past it
	// RabbitMQ drops the message (or dead-letters it, when a policy says
	// where). Defaults to 0: not set, which is unlimited on RabbitMQ 3.x
	// and 20 on RabbitMQ 4.0 and later.
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

// queueArgs returns the arguments of a consumer's queue.
func (t *Transport) queueArgs() amqp.Table {
	if t.cfg.ClassicQueues {
		return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}
	}
	args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if t.cfg.DeliveryLimit > 0 {
		args["x-delivery-limit"] = int64(t.cfg.DeliveryLimit)
	}
	return args
}

func (t *Transport) noteQueue(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queues[name] = true
}

// DeleteQueues deletes the queues this Transport has declared (consumers'
// queues and their delay queues), with the messages in them. It is for
// tests and for retiring consumers.
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
// consuming with manual acknowledgement.
// Messages published before the queue first existed were not routed to
// it. RabbitMQ has no per-delivery ack deadline: sub.AckWait is not used.
//
// Returns an error matching idem.ErrInvalidArgument when sub has no Topic
// or Consumer, a name too long for AMQP, or a negative AckWait or
// MaxInFlight; idem.ErrClosed after Close.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	switch {
	case sub.Topic == "":
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "must not be empty"}
	case sub.Consumer == "":
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "must not be empty"}
	case len(sub.Topic) > 255:
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "an AMQP binding key must fit in 255 bytes"}
	case len(t.delayQueue(t.Queue(sub.Consumer), time.Hour*24*365)) > 255:
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "too long for an AMQP queue name"}
	case sub.AckWait < 0:
		return nil, &idem.ArgumentError{Field: "Subscription.AckWait", Reason: "must not be negative"}
	case sub.MaxInFlight < 0:
		return nil, &idem.ArgumentError{Field: "Subscription.MaxInFlight", Reason: "must not be negative"}
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
	// handed out or not: no more than the prefetch.
	unsettled map[uint64]struct{}
}

// forward moves the channel's deliveries into g.buffered, recording each
// as unsettled first, until they end or the stream closes.
func (g *channelGen) forward(deliveries <-chan amqp.Delivery, done <-chan struct{}) {
	defer close(g.buffered)
	for d := range deliveries {
		g.settleMu.Lock()
		g.unsettled[d.DeliveryTag] = struct{}{}
		g.settleMu.Unlock()
		select {
		case g.buffered <- &d:
		case <-done:
			return
		}
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
	if top := multipleUpTo(g.unsettled, mine); top > 0 {
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
// unsettled tag not of mine, when at least two of mine are below it;
// otherwise 0, and one ack each is as few frames.
func multipleUpTo(unsettled map[uint64]struct{}, mine map[uint64]bool) uint64 {
	var other uint64 = math.MaxUint64
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
	if _, err := ch.QueueDeclare(s.queue, true, false, false, false, s.t.queueArgs()); err != nil {
		return fail("declare queue "+s.queue, err)
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
	// confuse the channel's replies.
	deliveries, err := ch.Consume(s.queue, "", false, false, false, false, nil)
	if err != nil {
		return fail("consume", err)
	}
	gen := &channelGen{
		ch:        ch,
		buffered:  make(chan *amqp.Delivery, min(prefetch, maxBuffered)),
		unsettled: make(map[uint64]struct{}),
	}
	go gen.forward(deliveries, s.done)
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
	return &delivery{s: s, d: d, m: m, attempt: attempt}
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
// x-delivery-count + the deliveries before a delayed copy was made.
func (d *delivery) Attempt() int { return d.attempt }

// Ack implements idem.Delivery with basic.ack.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func() error { return d.d.Ack(false) })
}

// Term implements idem.Delivery with basic.reject, requeue=false: the
// queue drops the message, or dead-letters it where a policy says so.
func (d *delivery) Term(ctx context.Context) error {
	return d.settle(ctx, "term", func() error { return d.d.Reject(false) })
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
