package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/secreturl"
)

// Transport is an idem.Publisher and idem.Subscriber over RabbitMQ. See the
// package documentation for what it guarantees.
type Transport struct {
	// urls are the nodes Open was given, dialled in turn; cur is the one
	// dialled last.
	urls []string
	cur  int
	cfg  Config

	mu     sync.Mutex
	closed bool
	conn   *amqp.Connection
	// streams are the open streams, closed with the Transport.
	streams map[*stream]struct{}
	// queues are the queues this Transport declared, for DeleteQueues.
	queues map[string]bool
	// delayQueues are when this Transport last declared each delay queue.
	delayQueues map[string]time.Time
	// warnings are what Warnings returns, one per queue at most.
	warnings []*Warning

	// pubLock, a semaphore of one, serialises publishing, so that a
	// Publish call's messages leave in order and their confirms and
	// returns are its own; waiting for it honours the caller's context.
	pubLock chan struct{}
	pub     *pubChannel
}

var (
	_ idem.Publisher   = (*Transport)(nil)
	_ idem.Subscriber  = (*Transport)(nil)
	_ idem.BatchStream = (*stream)(nil)
)

// Open connects to RabbitMQ at url and declares the exchange. cfg may be
// nil. The Transport dials again when it finds its connection closed.
//
// url may list the nodes of a cluster, comma-separated (a comma in a
// password is written %2C): Open connects to the first that answers, and
// when the connection is lost the Transport dials the next ones in turn,
// starting after the node it lost, so that it goes on through the nodes
// that are left.
func Open(ctx context.Context, url string, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var urls []string
	for _, u := range strings.Split(url, ",") {
		if u = strings.TrimSpace(u); u == "" {
			return nil, &idem.ArgumentError{Field: "url", Reason: "an empty node in the comma-separated list"}
		}
		urls = append(urls, u)
	}
	t := &Transport{urls: urls, cfg: c, streams: make(map[*stream]struct{}), queues: make(map[string]bool), delayQueues: make(map[string]time.Time), pubLock: make(chan struct{}, 1)}
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
	ch, _, err := t.channelOn(ctx)
	return ch, err
}

// channelOn is channel, with the connection the channel is on.
func (t *Transport) channelOn(ctx context.Context) (*amqp.Channel, *amqp.Connection, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, nil, idem.ErrClosed
	}
	if t.conn == nil || t.conn.IsClosed() {
		conn, err := t.dial(ctx)
		if err != nil {
			t.mu.Unlock()
			return nil, nil, err
		}
		t.conn = conn
	}
	conn := t.conn
	// Opened without t.mu: a broker that never answers channel.open
	// holds this call until the connection is closed, which abandon does
	// under t.mu.
	t.mu.Unlock()
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("idemamqp: open a channel: %w", err)
	}
	return ch, conn, nil
}

// dial connects to the first of the nodes that answers, starting after
// the one of the connection lost (if any), and returns the errors of all
// when none does. t.mu is held.
func (t *Transport) dial(ctx context.Context) (*amqp.Connection, error) {
	cfg := amqp.Config{Properties: amqp.NewConnectionProperties()}
	cfg.Properties.SetClientConnectionName("idem")
	if dl, ok := ctx.Deadline(); ok {
		cfg.Dial = amqp.DefaultDial(time.Until(dl))
	}
	first := t.cur
	if t.conn != nil {
		first++ // the node of the connection lost is tried last
	}
	var errs []error
	for i := range t.urls {
		n := (first + i) % len(t.urls)
		conn, err := amqp.DialConfig(t.urls[n], cfg)
		if err == nil {
			t.cur = n
			return conn, nil
		}
		// amqp091 quotes a URL it cannot parse, password and all.
		errs = append(errs, secreturl.Scrub(err, t.urls[n]))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("idemamqp: dial: %w", errors.Join(errs...))
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
	// A publish under way ends with the connection.
	select {
	case t.pubLock <- struct{}{}:
		t.dropPublisher()
		<-t.pubLock
	default:
	}
	if conn != nil && !conn.IsClosed() {
		if err := conn.CloseDeadline(time.Now().Add(closeTimeout)); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("idemamqp: close: %w", err)
		}
	}
	return nil
}

// closeTimeout bounds the wait for the broker's answer when a connection
// is closed: one that stopped answering is dropped all the same.
const closeTimeout = 5 * time.Second

// abandon drops the connection in use, without waiting for the broker:
// after it stopped confirming on it, so that every channel on it (the
// streams', whose unsettled deliveries the broker then requeues, and the
// publisher's) starts afresh on a new one.
func (t *Transport) abandon(ctx context.Context, why error) {
	t.mu.Lock()
	conn := t.conn
	t.conn = nil
	streams := make([]*stream, 0, len(t.streams))
	for s := range t.streams {
		streams = append(streams, s)
	}
	t.mu.Unlock()
	if conn == nil || conn.IsClosed() {
		return
	}
	// Before the connection is closed, in the background: a stream's next
	// delivery must not be one already waiting on it.
	for _, s := range streams {
		s.mu.Lock()
		if s.gen != nil && s.gen.conn == conn {
			s.gen.dropped.Store(true)
		}
		s.mu.Unlock()
	}
	t.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "RabbitMQ stopped answering on a connection; dropping it", slog.String("error", why.Error()))
	go func() { _ = conn.CloseDeadline(time.Now().Add(closeTimeout)) }()
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
