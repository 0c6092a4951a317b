package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
)

// Header names the transport reserves. The broker reads Nats-Msg-Id; the
// others carry the fields of idem.Message that NATS has no place for.
const (
	// HeaderKey carries Message.Key.
	HeaderKey = "Idem-Key"
	// HeaderTime carries Message.Time, RFC 3339 with nanoseconds, when the
	// publisher set it; otherwise a delivery's Time is when the stream
	// stored the message.
	HeaderTime = "Idem-Time"
	// headerMsgID is JetStream's de-duplication header.
	headerMsgID = "Nats-Msg-Id"
)

// ErrStaleDelivery is returned by a Delivery's methods once it has been
// settled.
var ErrStaleDelivery = errors.New("idemnats: delivery already settled")

// Config configures a Transport. The zero value is ready to use.
type Config struct {
	// Stream is the JetStream stream messages are published to and
	// consumed from. Defaults to "IDEM".
	Stream string
	// SubjectPrefix is put before a topic, with a dot, to make its
	// subject: topic "payments.succeeded" is subject
	// "idem.payments.succeeded". Defaults to "idem".
	SubjectPrefix string
	// Subjects are the subjects of the stream when the transport creates
	// it. Defaults to "<SubjectPrefix>.>".
	Subjects []string
	// Duplicates is the stream's de-duplication window when the transport
	// creates it: a message whose Nats-Msg-Id was stored within it is
	// acknowledged and dropped. Defaults to the server's (2 minutes).
	Duplicates time.Duration
	// MaxAge bounds how long the stream keeps a message when the transport
	// creates it. Defaults to 0: kept until deleted, since a message
	// dropped before every consumer has it is lost.
	MaxAge time.Duration
	// AckWait is the AckWait of subscriptions that leave it zero. Defaults
	// to 30s.
	AckWait time.Duration
	// MaxInFlight is the MaxInFlight of subscriptions that leave it zero;
	// it becomes the consumer's MaxAckPending. Defaults to 1000.
	MaxInFlight int
	// MaxDeliver is the consumers' MaxDeliver: after that many deliveries
	// the server stops delivering a message, without telling the
	// consumer. Defaults to 0: unlimited, so that the consumer package,
	// which records every attempt, decides when a message is dead.
	MaxDeliver int
	// PollWait bounds one pull request: a Next that waits longer sends
	// another. A pull request abandoned by a Close may still take a
	// message, which then comes back after its AckWait. Defaults to 5s.
	PollWait time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Stream == "" {
		cfg.Stream = "IDEM"
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = "idem"
	}
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = []string{cfg.SubjectPrefix + ".>"}
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1000
	}
	if cfg.PollWait == 0 {
		cfg.PollWait = 5 * time.Second
	}
	switch {
	case strings.ContainsAny(cfg.Stream, ".*> \t\r\n"):
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.Stream", Reason: "must not contain '.', '*', '>' or white space"}
	case !validSubject(cfg.SubjectPrefix, false):
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.SubjectPrefix", Reason: "must be a subject without wildcards"}
	case cfg.Duplicates < 0, cfg.MaxAge < 0, cfg.AckWait < 0, cfg.MaxInFlight < 0, cfg.MaxDeliver < 0:
		return cfg, &idem.ArgumentError{Field: "idemnats.Config", Reason: "durations and counts must not be negative"}
	case cfg.PollWait < 100*time.Millisecond || cfg.PollWait >= 10*time.Second:
		// At 10s the client asks the server for idle heartbeats, a
		// newer feature; below 100ms polling is wasteful.
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.PollWait", Reason: "must be at least 100ms and under 10s"}
	}
	return cfg, nil
}

// Transport is an idem.Publisher and idem.Subscriber over a JetStream
// stream. See the package documentation for what it guarantees.
type Transport struct {
	cfg Config
	js  jetstream.JetStream
	// owned is the connection Open made, closed by Close; nil after New.
	owned *nats.Conn

	mu      sync.Mutex
	closed  bool
	streams map[*stream]struct{}
}

var (
	_ idem.Publisher  = (*Transport)(nil)
	_ idem.Subscriber = (*Transport)(nil)
)

// Open connects to the NATS server at url and returns a Transport that
// owns the connection: Close closes it. cfg may be nil.
func Open(ctx context.Context, url string, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, nats.Name("idem"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("idemnats: connect: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("idemnats: %w", err)
	}
	t, err := newTransport(ctx, js, c)
	if err != nil {
		nc.Close()
		return nil, err
	}
	t.owned = nc
	return t, nil
}

// New returns a Transport on js, whose connection the caller keeps and
// closes. cfg may be nil.
func New(ctx context.Context, js jetstream.JetStream, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return newTransport(ctx, js, c)
}

func newTransport(ctx context.Context, js jetstream.JetStream, cfg Config) (*Transport, error) {
	if err := ensureStream(ctx, js, cfg); err != nil {
		return nil, err
	}
	return &Transport{cfg: cfg, js: js, streams: make(map[*stream]struct{})}, nil
}

// ensureStream creates the stream when it does not exist. An existing
// stream is left as it is: its limits may have been set by its operators,
// and an update would overwrite them.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	_, err := js.Stream(ctx, cfg.Stream)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("idemnats: look up stream %q: %w", cfg.Stream, err)
	}
	sc := jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   cfg.Subjects,
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: cfg.Duplicates,
		MaxAge:     cfg.MaxAge,
	}
	for try := 1; ; try++ {
		_, err = js.CreateStream(ctx, sc)
		if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil
		}
		if !storeRace(err) || try == storeRetries {
			return fmt.Errorf("idemnats: create stream %q: %w", cfg.Stream, err)
		}
		timer := time.NewTimer(time.Duration(try) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("idemnats: create stream %q: %w (after %w)", cfg.Stream, ctx.Err(), err)
		case <-timer.C:
		}
	}
}

// storeRetries bounds the attempts to create a stream when storeRace.
const storeRetries = 5

// storeRace reports whether err is the server's failure to create a
// stream's store. nats-server 2.9 removes an account's streams directory
// when its last stream is deleted, and a stream created at that moment
// fails this way; a second try succeeds.
func storeRace(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.ErrorCode(10049)
}

// Subject returns the subject topic is published to.
func (t *Transport) Subject(topic string) string { return t.cfg.SubjectPrefix + "." + topic }

// topic returns the topic of subject, the inverse of Subject.
func (t *Transport) topic(subject string) string {
	return strings.TrimPrefix(subject, t.cfg.SubjectPrefix+".")
}

// Publish implements idem.Publisher. Each message is published with its
// ID as Nats-Msg-Id and awaits its PubAck before the next is sent, so they
// are stored in order and, once Publish returns nil, durably (as the
// stream's storage and replicas make them). A message the stream already
// holds within its Duplicates window is acknowledged as a duplicate and
// not stored again.
//
// Returns an error matching idem.ErrInvalidArgument, having published
// nothing, when a message does not validate, its topic is not a subject
// without wildcards, or a header cannot travel as a NATS header (see the
// package documentation); idem.ErrClosed after Close.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	out := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		nm, err := t.toNATS(m)
		if err != nil {
			return err
		}
		out[i] = nm
	}
	if err := t.checkOpen(); err != nil {
		return err
	}
	for i, nm := range out {
		ack, err := t.js.PublishMsg(ctx, nm, jetstream.WithMsgID(msgs[i].ID), jetstream.WithExpectStream(t.cfg.Stream))
		if err != nil {
			return fmt.Errorf("idemnats: publish %q to %s: %w", msgs[i].ID, nm.Subject, err)
		}
		if ack == nil {
			return fmt.Errorf("idemnats: publish %q: no acknowledgement", msgs[i].ID)
		}
	}
	return nil
}

func (t *Transport) checkOpen() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return idem.ErrClosed
	}
	return nil
}

// toNATS converts m, copying what it keeps.
func (t *Transport) toNATS(m idem.Message) (*nats.Msg, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if !validSubject(m.Topic, false) {
		return nil, &idem.ArgumentError{Field: "Message.Topic", Reason: "must be a NATS subject without wildcards or white space"}
	}
	nm := nats.NewMsg(t.Subject(m.Topic))
	for k, v := range m.Headers {
		if err := checkHeader(k, v); err != nil {
			return nil, err
		}
		nm.Header.Set(k, v)
	}
	if err := checkHeaderValue("Message.ID", m.ID); err != nil {
		return nil, err
	}
	if m.Key != "" {
		if err := checkHeaderValue("Message.Key", m.Key); err != nil {
			return nil, err
		}
		nm.Header.Set(HeaderKey, m.Key)
	}
	if !m.Time.IsZero() {
		nm.Header.Set(HeaderTime, m.Time.UTC().Format(time.RFC3339Nano))
	}
	nm.Data = append([]byte(nil), m.Payload...)
	return nm, nil
}

// reserved reports whether a header name belongs to the transport or the
// server rather than the message.
func reserved(name string) bool {
	return strings.HasPrefix(strings.ToLower(name), "nats-") ||
		strings.EqualFold(name, HeaderKey) || strings.EqualFold(name, HeaderTime)
}

// checkHeader reports whether a message header survives the NATS header
// encoding unchanged, which is line-based and trims a value's leading
// blanks.
func checkHeader(name, value string) error {
	field := "Message.Headers[" + fmt.Sprintf("%q", name) + "]"
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == ':' || r == 0x7f }) {
		return &idem.ArgumentError{Field: field, Reason: "a NATS header name must be non-empty, without ':', white space or control characters"}
	}
	if reserved(name) {
		return &idem.ArgumentError{Field: field, Reason: "the name is reserved (Nats-*, " + HeaderKey + ", " + HeaderTime + ")"}
	}
	return checkHeaderValue(field, value)
}

func checkHeaderValue(field, value string) error {
	if strings.ContainsAny(value, "\r\n") || strings.HasPrefix(value, " ") || strings.HasPrefix(value, "\t") {
		return &idem.ArgumentError{Field: field, Reason: "a NATS header value must not contain a line break or begin with a blank"}
	}
	return nil
}

// validSubject reports whether s is a NATS subject: dot-separated
// non-empty tokens without white space, and without the wildcards '*' and
// '>' unless wildcards is set.
func validSubject(s string, wildcards bool) bool {
	if s == "" {
		return false
	}
	tokens := strings.Split(s, ".")
	for i, tok := range tokens {
		if tok == "" || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return false
		}
		if strings.ContainsAny(tok, "*>") {
			if !wildcards || (tok != "*" && tok != ">") || (tok == ">" && i != len(tokens)-1) {
				return false
			}
		}
	}
	return true
}

// validConsumer reports whether s can be a durable consumer's name.
func validConsumer(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return r <= ' ' || r == 0x7f || r == '.' || r == '*' || r == '>' || r == '/' || r == '\\'
	})
}

// Subscribe implements idem.Subscriber with a durable pull consumer named
// sub.Consumer, filtered to the topic's subject (wildcards allowed), with
// explicit acknowledgement, AckWait and MaxAckPending from sub, and
// delivering from the start of the stream when it is first created. The
// consumer is created, or updated to sub's settings, before Subscribe
// returns, so messages published afterwards are not missed.
//
// Returns an error matching idem.ErrInvalidArgument when sub has no Topic
// or Consumer, a topic that is not a subject, a consumer name with '.',
// '*', '>' or white space, or a negative AckWait or MaxInFlight;
// idem.ErrClosed after Close.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	switch {
	case sub.Topic == "":
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "must not be empty"}
	case sub.Consumer == "":
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "must not be empty"}
	case !validSubject(sub.Topic, true):
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "must be a NATS subject"}
	case !validConsumer(sub.Consumer):
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "must not contain '.', '*', '>', slashes or white space"}
	case sub.AckWait < 0:
		return nil, &idem.ArgumentError{Field: "Subscription.AckWait", Reason: "must not be negative"}
	case sub.MaxInFlight < 0:
		return nil, &idem.ArgumentError{Field: "Subscription.MaxInFlight", Reason: "must not be negative"}
	}
	if err := t.checkOpen(); err != nil {
		return nil, err
	}
	if sub.AckWait == 0 {
		sub.AckWait = t.cfg.AckWait
	}
	if sub.MaxInFlight == 0 {
		sub.MaxInFlight = t.cfg.MaxInFlight
	}
	maxDeliver := t.cfg.MaxDeliver
	if maxDeliver == 0 {
		maxDeliver = -1
	}
	cons, err := t.js.CreateOrUpdateConsumer(ctx, t.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       sub.Consumer,
		FilterSubject: t.Subject(sub.Topic),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       sub.AckWait,
		MaxAckPending: sub.MaxInFlight,
		MaxDeliver:    maxDeliver,
	})
	if err != nil {
		return nil, fmt.Errorf("idemnats: consumer %q on %s: %w", sub.Consumer, t.Subject(sub.Topic), err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &stream{t: t, cons: cons, ctx: sctx, cancel: cancel}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		cancel()
		return nil, idem.ErrClosed
	}
	t.streams[s] = struct{}{}
	return s, nil
}

// Close closes every stream and makes Publish and Subscribe return
// idem.ErrClosed. It closes the connection when Open made it. Closing
// twice is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	streams := t.streams
	t.streams = nil
	t.mu.Unlock()
	for s := range streams {
		s.cancel()
	}
	if t.owned != nil {
		t.owned.Close()
	}
	return nil
}

type stream struct {
	t    *Transport
	cons jetstream.Consumer
	// ctx is cancelled by Close, which ends a waiting Next.
	ctx    context.Context
	cancel context.CancelFunc
}

// minPull is the shortest pull request worth sending: a Next with less
// time left waits it out.
const minPull = 20 * time.Millisecond

// Next implements idem.Stream. It pulls one message at a time, so a
// message is delivered (and its AckWait starts) only when a caller asks
// for it. A pull request expires before ctx does, so a message published
// after Next gave up is not taken by it.
func (s *stream) Next(ctx context.Context) (idem.Delivery, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if s.ctx.Err() != nil {
			return nil, idem.ErrClosed
		}
		d, err := s.pull(ctx)
		if d != nil || err != nil {
			return d, err
		}
	}
}

// pull sends one pull request and waits for it to be answered; it returns
// nil, nil when the request expired with nothing.
func (s *stream) pull(ctx context.Context) (idem.Delivery, error) {
	pctx, cancel := context.WithTimeout(ctx, s.t.cfg.PollWait)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	if dl, _ := pctx.Deadline(); time.Until(dl) < minPull {
		<-pctx.Done()
		return nil, s.ended(ctx, nil)
	}
	msg, err := s.cons.Next(jetstream.FetchContext(pctx))
	if msg != nil {
		return s.t.delivery(msg)
	}
	if err == nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return nil, s.ended(ctx, nil)
	}
	if e := s.ended(ctx, nil); e != nil {
		return nil, e
	}
	if errors.Is(err, nats.ErrConnectionClosed) {
		return nil, fmt.Errorf("idemnats: next: %w (%w)", idem.ErrClosed, err)
	}
	return nil, fmt.Errorf("idemnats: next: %w", err)
}

// ended returns why Next must stop, or err when it need not.
func (s *stream) ended(ctx context.Context, err error) error {
	if s.ctx.Err() != nil {
		return idem.ErrClosed
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Close implements idem.Stream. The consumer stays on the server, so the
// messages this stream holds unsettled are delivered again when their
// AckWait ends, to this consumer name's other or next streams.
func (s *stream) Close() error {
	s.cancel()
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	delete(s.t.streams, s)
	return nil
}

func (t *Transport) delivery(msg jetstream.Msg) (idem.Delivery, error) {
	md, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: leave it to its AckWait.
		return nil, fmt.Errorf("idemnats: next: %w", err)
	}
	h := msg.Headers()
	m := idem.Message{
		ID:      h.Get(headerMsgID),
		Topic:   t.topic(msg.Subject()),
		Key:     h.Get(HeaderKey),
		Payload: append([]byte(nil), msg.Data()...),
		Time:    md.Timestamp,
	}
	if ts := h.Get(HeaderTime); ts != "" {
		if tm, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			m.Time = tm
		}
	}
	for k, vs := range h {
		if reserved(k) || len(vs) == 0 {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[k] = vs[0]
	}
	return &delivery{t: t, msg: msg, m: m, attempt: int(md.NumDelivered)}, nil
}

type delivery struct {
	t       *Transport
	msg     jetstream.Msg
	m       idem.Message
	attempt int

	mu      sync.Mutex
	settled bool
}

// Message implements idem.Delivery.
func (d *delivery) Message() idem.Message { return d.m }

// Attempt implements idem.Delivery: the consumer's NumDelivered for the
// message, which the server keeps across streams and restarts.
func (d *delivery) Attempt() int { return d.attempt }

// Ack implements idem.Delivery with a double ack: it returns once the
// server has recorded the acknowledgement, so a message Ack has settled
// is not delivered again.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func() error { return d.msg.DoubleAck(ctx) })
}

// Nack implements idem.Delivery with a NAK, delayed by delay when it is
// positive: the server delivers the message again after it. The NAK is
// flushed to the server before Nack returns, though not confirmed; if it
// is lost the AckWait brings the message back.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	return d.settle(ctx, "nack", func() error {
		if delay > 0 {
			return d.msg.NakWithDelay(delay)
		}
		return d.msg.Nak()
	})
}

// Term implements idem.Delivery with a TERM: the server does not deliver
// the message to this consumer again. Flushed, not confirmed, as Nack.
func (d *delivery) Term(ctx context.Context) error {
	return d.settle(ctx, "term", d.msg.Term)
}

// InProgress implements idem.Delivery: the server starts the delivery's
// AckWait again.
func (d *delivery) InProgress(ctx context.Context) error {
	d.mu.Lock()
	settled := d.settled
	d.mu.Unlock()
	if settled {
		return fmt.Errorf("idemnats: in progress: message %q: %w", d.m.ID, ErrStaleDelivery)
	}
	if err := d.msg.InProgress(); err != nil {
		return fmt.Errorf("idemnats: in progress: message %q: %w", d.m.ID, err)
	}
	return d.flush(ctx, "in progress")
}

func (d *delivery) settle(ctx context.Context, op string, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return fmt.Errorf("idemnats: %s: message %q: %w", op, d.m.ID, ErrStaleDelivery)
	}
	if err := fn(); err != nil {
		if errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			d.settled = true
			return fmt.Errorf("idemnats: %s: message %q: %w", op, d.m.ID, ErrStaleDelivery)
		}
		return fmt.Errorf("idemnats: %s: message %q: %w", op, d.m.ID, err)
	}
	d.settled = true
	if op == "ack" {
		return nil // DoubleAck waited for the server already
	}
	return d.flush(ctx, op)
}

// flushWait bounds a flush when ctx has no deadline.
const flushWait = 5 * time.Second

// flush waits until the server has read what was sent, so a settlement
// is not left in a client buffer.
func (d *delivery) flush(ctx context.Context, op string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushWait)
		defer cancel()
	}
	if err := d.t.js.Conn().FlushWithContext(ctx); err != nil {
		return fmt.Errorf("idemnats: %s: message %q: flush: %w", op, d.m.ID, err)
	}
	return nil
}
