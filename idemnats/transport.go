package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/secreturl"
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
// settled, or once its stream has received a later delivery of its
// message (after its AckWait). A later delivery to another stream of the
// same consumer cannot be told: JetStream acknowledges by stream
// sequence, so the earlier delivery's methods still answer, and its Ack
// settles the message.
// It matches idem.ErrStaleDelivery.
var ErrStaleDelivery = fmt.Errorf("idemnats: delivery already settled (%w)", idem.ErrStaleDelivery)

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
	// creates it; it is reported in Warnings. Defaults to 0: kept until
	// deleted, since a message dropped before every consumer has it is
	// lost.
	MaxAge time.Duration
	// AckWait is the AckWait of subscriptions that leave it zero. Defaults
	// to 30s.
	AckWait time.Duration
	// MaxInFlight is the MaxInFlight of subscriptions that leave it zero;
	// it becomes the consumer's MaxAckPending. Defaults to 1000.
	MaxInFlight int
	// MaxDeliver is the consumers' MaxDeliver: after that many deliveries
	// the server stops delivering a message, without telling the
	// consumer, so each consumer Subscribe makes with it is reported in
	// Warnings. Defaults to 0: unlimited, so that the consumer package,
	// which records every attempt, decides when a message is dead.
	MaxDeliver int
	// PollWait bounds one pull request: a Next that waits longer sends
	// another. Defaults to 5s.
	PollWait time.Duration
	// Replicas is the stream's number of replicas when the transport
	// creates it: on a cluster of three servers or more, 3 keeps every
	// acknowledged message on three servers and the stream available when
	// one is lost. On a cluster, a stream with fewer than 3 is reported in
	// Warnings, the transport's own or one that exists. Defaults to 1, which
	// a single server needs.
	Replicas int
	// SyncAlways states that every server of the stream runs with
	// sync_interval: always (nats-server 2.10 and later), so that a
	// PubAck means the message is fsynced. No client can read that
	// setting, so the transport takes the operator's word for it; unset,
	// DurabilityWarnings reports it. Defaults to false.
	SyncAlways bool
	// Logger receives the Warnings as they are found, at level Warn.
	// Defaults to a logger that discards.
	Logger *slog.Logger
	// PublishWindow bounds the messages of one Publish call that have
	// been sent and await their PubAck: Publish sends that many ahead
	// before it waits for the oldest acknowledgement. 1 sends each message
	// only after the previous one's PubAck, which keeps a topic's order
	// even across a failed and retried Publish (see the package
	// documentation), at one round trip per message. Defaults to 256.
	PublishWindow int
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
	if cfg.PublishWindow == 0 {
		cfg.PublishWindow = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case strings.ContainsAny(cfg.Stream, ".*> \t\r\n"):
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.Stream", Reason: "must not contain '.', '*', '>' or white space"}
	case !validSubject(cfg.SubjectPrefix, false):
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.SubjectPrefix", Reason: "must be a subject without wildcards"}
	case cfg.Duplicates < 0, cfg.MaxAge < 0, cfg.AckWait < 0, cfg.MaxInFlight < 0, cfg.MaxDeliver < 0, cfg.PublishWindow < 0,
		cfg.Replicas < 0:
		return cfg, &idem.ArgumentError{Field: "idemnats.Config", Reason: "durations and counts must not be negative"}
	case cfg.Replicas > 5:
		// JetStream's own bound: a larger stream is refused by the server.
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.Replicas", Reason: "must be at most 5"}
	case cfg.PollWait < 100*time.Millisecond || cfg.PollWait >= 10*time.Second:
		// A longer pull would want the server's idle heartbeats to tell
		// a lost request from a quiet one; below 100ms polling is
		// wasteful.
		return cfg, &idem.ArgumentError{Field: "idemnats.Config.PollWait", Reason: "must be at least 100ms and under 10s"}
	}
	return cfg, nil
}

// Transport is an idem.Publisher and idem.Subscriber over a JetStream
// stream. See the package documentation for what it guarantees.
type Transport struct {
	cfg Config
	js  jetstream.JetStream
	nc  *nats.Conn
	// api is the prefix of the JetStream API's subjects, "$JS.API." unless
	// js was made for a domain or with another prefix.
	api string
	// ackTimeout bounds the wait for one PubAck, from when its message
	// was sent: the JetStream context's DefaultTimeout.
	ackTimeout time.Duration
	// owned is the connection Open made, closed by Close; nil after New.
	owned *nats.Conn
	// done is closed by Close, ending Publish calls that wait for
	// PubAcks.
	done chan struct{}

	mu      sync.Mutex
	closed  bool
	streams map[*stream]struct{}
	// warnings are what Warnings returns.
	warnings []*Warning

	// givingBack counts the goroutines that collect pull requests and
	// hand back what they brought for nobody; Close waits for them. bgMu
	// guards bgClosed, after which no more start.
	givingBack sync.WaitGroup
	bgMu       sync.Mutex
	bgClosed   bool
}

var (
	_ idem.Publisher   = (*Transport)(nil)
	_ idem.Subscriber  = (*Transport)(nil)
	_ idem.BatchStream = (*stream)(nil)
)

// Open connects to the NATS server at url and returns a Transport that
// owns the connection: Close closes it. url may list several servers of a
// cluster, comma-separated, as nats.Connect takes them: the connection
// goes to one and, when that one is lost, reconnects to another, without
// end. cfg may be nil. The stream is
// created when missing, or else left as it is, and its settings that can
// drop a message are reported in Warnings (see the package
// documentation).
func Open(ctx context.Context, url string, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, nats.Name("idem"), nats.MaxReconnects(-1))
	if err != nil {
		// nats.go quotes a URL it cannot parse, token and all.
		return nil, fmt.Errorf("idemnats: connect: %w", secreturl.Scrub(err, url))
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
// closes. cfg may be nil. It finds or creates the stream as Open does.
func New(ctx context.Context, js jetstream.JetStream, cfg *Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return newTransport(ctx, js, c)
}

func newTransport(ctx context.Context, js jetstream.JetStream, cfg Config) (*Transport, error) {
	st, err := ensureStream(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	opts := js.Options()
	ackTimeout := opts.DefaultTimeout
	if ackTimeout <= 0 {
		ackTimeout = 5 * time.Second
	}
	t := &Transport{
		cfg:        cfg,
		js:         js,
		nc:         js.Conn(),
		api:        apiPrefix(opts),
		ackTimeout: ackTimeout,
		done:       make(chan struct{}),
		streams:    make(map[*stream]struct{}),
	}
	t.warn(ctx, inspectStream(ctx, st, cfg.Logger)...)
	if w := replicasWarning(st.CachedInfo().Config, t.nc.ConnectedClusterName()); w != nil {
		t.warn(ctx, w)
	}
	return t, nil
}

// apiPrefix returns the prefix of the JetStream API's subjects for opts,
// as the jetstream package builds it: pull requests are sent by the
// transport itself, so that it can withdraw them.
func apiPrefix(opts jetstream.JetStreamOptions) string {
	switch {
	case opts.Domain != "":
		return "$JS." + opts.Domain + ".API."
	case opts.APIPrefix != "":
		return strings.TrimSuffix(opts.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// ensureStream creates the stream when it does not exist, and returns it.
// An existing stream is left as it is: its limits may have been set by its
// operators, and an update would overwrite them.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, cfg.Stream)
	if err == nil {
		return st, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("idemnats: look up stream %q: %w", cfg.Stream, err)
	}
	// Discard new: the stream has no limits, but should its operators
	// give it some, a full stream refuses a publish, which the outbox
	// retries, rather than dropping its oldest message.
	sc := jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   cfg.Subjects,
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardNew,
		Duplicates: cfg.Duplicates,
		MaxAge:     cfg.MaxAge,
		Replicas:   cfg.Replicas,
	}
	for try := 1; ; try++ {
		st, err = js.CreateStream(ctx, sc)
		if err == nil {
			return st, nil
		}
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if st, err = js.Stream(ctx, cfg.Stream); err != nil {
				return nil, fmt.Errorf("idemnats: look up stream %q: %w", cfg.Stream, err)
			}
			return st, nil
		}
		if !storeRace(err) || try == storeRetries {
			return nil, fmt.Errorf("idemnats: create stream %q: %w", cfg.Stream, err)
		}
		timer := time.NewTimer(time.Duration(try) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("idemnats: create stream %q: %w (after %w)", cfg.Stream, ctx.Err(), err)
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
// ID as Nats-Msg-Id, asynchronously: up to Config.PublishWindow messages
// are sent ahead of their PubAcks, in order on one connection, so the
// stream stores them in the order given, and Publish returns nil only once
// every PubAck has come back, when the stream holds them durably (as its
// storage and replicas make them). A message the stream already holds
// within its Duplicates window is acknowledged as a duplicate and not
// stored again. Each PubAck is awaited up to the JetStream context's
// DefaultTimeout (5s unless set otherwise) from when its message was
// sent, and no longer than ctx lasts.
//
// On an error some messages may have been stored, later ones among them
// (see the package documentation for what that means for order).
//
// Returns an error matching idem.ErrInvalidArgument, having published
// nothing, when a message does not validate, its topic is not a subject
// without wildcards, or a header cannot travel as a NATS header (see the
// package documentation); idem.ErrClosed after Close, or when Close is
// called while Publish waits; ctx's error when it ends first.
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
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemnats: publish: %w", err)
	}
	if len(out) == 0 {
		return nil
	}
	w := newAckWindow(min(len(out), t.cfg.PublishWindow))
	for i, nm := range out {
		if w.full() {
			if err := t.awaitAck(ctx, w.pop()); err != nil {
				return err
			}
		}
		f, err := t.publishAsync(ctx, nm, msgs[i].ID, w)
		if err != nil {
			return err
		}
		w.push(pubAck{id: msgs[i].ID, subject: nm.Subject, f: f, sent: time.Now()})
	}
	for !w.empty() {
		if err := t.awaitAck(ctx, w.pop()); err != nil {
			return err
		}
	}
	return nil
}

// pubAck is a message sent and awaiting its PubAck.
type pubAck struct {
	id, subject string
	f           jetstream.PubAckFuture
	sent        time.Time
}

// ackWindow is the ring of a Publish call's messages awaiting PubAcks,
// oldest first.
type ackWindow struct {
	ring     []pubAck
	first, n int
}

func newAckWindow(size int) *ackWindow { return &ackWindow{ring: make([]pubAck, size)} }

func (w *ackWindow) full() bool  { return w.n == len(w.ring) }
func (w *ackWindow) empty() bool { return w.n == 0 }

func (w *ackWindow) push(a pubAck) {
	w.ring[(w.first+w.n)%len(w.ring)] = a
	w.n++
}

func (w *ackWindow) pop() pubAck {
	a := w.ring[w.first]
	w.ring[w.first] = pubAck{}
	w.first = (w.first + 1) % len(w.ring)
	w.n--
	return a
}

// publishAsync sends nm. When the JetStream context's own bound on
// outstanding PubAcks (shared with every other publisher on it) is
// reached, it waits for the oldest of w, or, with none, tries again, for
// at most the ack timeout.
func (t *Transport) publishAsync(ctx context.Context, nm *nats.Msg, id string, w *ackWindow) (jetstream.PubAckFuture, error) {
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(id), jetstream.WithExpectStream(t.cfg.Stream)}
	if t.cfg.PublishWindow > 1 {
		// The library resends a message the stream did not answer
		// (no responders) a moment later, behind the messages sent
		// since: reported instead, as a failed Publish, it cannot
		// reorder them unnoticed.
		opts = append(opts, jetstream.WithRetryAttempts(0))
	}
	var stalled time.Time
	for {
		f, err := t.js.PublishMsgAsync(nm, opts...)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			if errors.Is(err, nats.ErrConnectionClosed) {
				return nil, fmt.Errorf("idemnats: publish %q to %s: %w (%w)", id, nm.Subject, idem.ErrClosed, err)
			}
			return nil, fmt.Errorf("idemnats: publish %q to %s: %w", id, nm.Subject, err)
		}
		if stalled.IsZero() {
			stalled = time.Now()
		}
		switch {
		case !w.empty():
			if err := t.awaitAck(ctx, w.pop()); err != nil {
				return nil, err
			}
		case ctx.Err() != nil:
			return nil, fmt.Errorf("idemnats: publish %q to %s: %w", id, nm.Subject, ctx.Err())
		case t.checkOpen() != nil:
			return nil, fmt.Errorf("idemnats: publish %q to %s: %w", id, nm.Subject, idem.ErrClosed)
		case time.Since(stalled) > t.ackTimeout:
			return nil, fmt.Errorf("idemnats: publish %q to %s: %w", id, nm.Subject, err)
		}
	}
}

// awaitAck waits for a's PubAck.
func (t *Transport) awaitAck(ctx context.Context, a pubAck) error {
	fail := func(err error) error {
		return fmt.Errorf("idemnats: publish %q to %s: %w", a.id, a.subject, err)
	}
	select {
	case <-a.f.Ok():
		return nil
	case err := <-a.f.Err():
		return fail(err)
	default:
	}
	timer := time.NewTimer(time.Until(a.sent.Add(t.ackTimeout)))
	defer timer.Stop()
	select {
	case <-a.f.Ok():
		return nil
	case err := <-a.f.Err():
		return fail(err)
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-t.done:
		return fail(idem.ErrClosed)
	case <-timer.C:
		return fail(fmt.Errorf("no PubAck within %v: %w", t.ackTimeout, nats.ErrTimeout))
	}
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
	if err := sub.Validate(); err != nil {
		return nil, err
	}
	switch {
	case !validSubject(sub.Topic, true):
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "must be a NATS subject"}
	case !validConsumer(sub.Consumer):
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "must not contain '.', '*', '>', slashes or white space"}
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
	name := cons.CachedInfo().Name
	if t.cfg.MaxDeliver > 0 {
		t.warn(ctx, maxDeliverWarning(t.cfg.Stream, name, t.cfg.MaxDeliver))
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &stream{
		t:        t,
		cons:     cons,
		next:     t.api + "CONSUMER.MSG.NEXT." + t.cfg.Stream + "." + name,
		maxBatch: sub.MaxInFlight,
		ctx:      sctx,
		cancel:   cancel,
		changed:  make(chan struct{}),
		held:     make(map[uint64]*delivery),
	}
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
// idem.ErrClosed; Publish calls waiting for PubAcks return it too. It
// waits for the messages that abandoned pull requests received to be
// handed back, then closes the connection when Open made it. Closing
// twice is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	streams := t.streams
	t.streams = nil
	t.mu.Unlock()
	for s := range streams {
		s.cancel()
	}
	t.bgMu.Lock()
	t.bgClosed = true
	t.bgMu.Unlock()
	t.givingBack.Wait()
	if t.owned != nil {
		t.owned.Close()
	}
	return nil
}

// background runs fn in a goroutine Close waits for, and reports false,
// without running it, once Close has begun.
func (t *Transport) background(fn func()) bool {
	t.bgMu.Lock()
	defer t.bgMu.Unlock()
	if t.bgClosed {
		return false
	}
	t.givingBack.Add(1)
	go func() {
		defer t.givingBack.Done()
		fn()
	}()
	return true
}
