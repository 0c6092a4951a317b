package idemmem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// ErrStaleDelivery is returned by a Delivery's methods when it no longer
// stands for the message: it was settled already, or the message has been
// handed out again since (after its AckWait ended, or a Nack or a Close
// gave it back). InProgress also returns it once the delivery has gone
// back to the queue, since the next holder may already be working on it.
// It matches idem.ErrStaleDelivery.
var ErrStaleDelivery = fmt.Errorf("idemmem: delivery already settled or handed out again (%w)", idem.ErrStaleDelivery)

// TransportConfig configures a Transport. The zero value is ready to use.
type TransportConfig struct {
	// Clock judges Nack delays and AckWait. With a manual clock,
	// redeliveries happen when the test moves it. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
	// AckWait is the AckWait of subscriptions that leave it zero. Defaults
	// to 30s.
	AckWait time.Duration
	// MaxInFlight is the MaxInFlight of subscriptions that leave it zero.
	// Defaults to 1000.
	MaxInFlight int
	// Poll is how often a Next that waits looks at the clock again, to see
	// a Nack delay or an AckWait end. It bounds how late a redelivery comes
	// after its time. Defaults to 10ms.
	Poll time.Duration
}

// Transport is an in-memory idem.Publisher and idem.Subscriber: the
// reference for the semantics transports share, not for durability.
//
// Each topic is a log of every message published to it, kept for the life
// of the Transport. A consumer name is a durable cursor over one topic's
// log, created by its first Subscribe, which starts at the beginning of the
// log (so nothing published before the first subscription is missed), plus
// the messages it has been given and not settled. Several streams of one
// consumer name share its messages, each going to one of them, as
// competing consumers do; each consumer name gets every message.
//
// Publish does not de-duplicate: a message published twice, with one ID, is
// delivered twice, as it would be by a broker past its de-duplication
// window; consumers absorb it.
//
// A message is handed to the stream that asks for it, oldest first, so a
// topic's messages come in publish order except for redeliveries, which
// come again in order too, before newer messages. It comes again when it is
// Nacked (after the delay), when its AckWait ends without a settlement or
// InProgress, and at once when its stream is closed. Attempt counts its
// deliveries to the consumer name, across streams.
//
// Its streams are idem.BatchStream and idem.BatchRenewer, as the database
// transports' are, so that tests on it take the consumer's batch paths.
//
// Nothing runs in the background: a Next that has nothing to hand out waits
// for a publish, a settlement or a Close, and looks at the clock every Poll
// for a delay or an AckWait to end. The zero Transport is not usable; call
// NewTransport.
type Transport struct {
	clock       idem.Clock
	ackWait     time.Duration
	maxInFlight int
	poll        time.Duration

	mu      sync.Mutex
	closed  bool
	topics  map[string]*topicLog
	streams map[*stream]struct{}
}

var (
	_ idem.Publisher    = (*Transport)(nil)
	_ idem.Subscriber   = (*Transport)(nil)
	_ idem.BatchStream  = (*stream)(nil)
	_ idem.BatchRenewer = (*stream)(nil)
)

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

type topicLog struct {
	msgs      []idem.Message
	consumers map[string]*memConsumer
}

// memConsumer is one consumer name's durable state on one topic.
type memConsumer struct {
	log *topicLog
	// next indexes the first message of the log never handed out.
	next int
	// pending holds the messages handed out and not settled, by log index.
	pending map[int]*pendingMsg
	// inFlight counts the pending messages some stream holds.
	inFlight int
	// changed is closed, and replaced, when something a waiting Next may
	// be waiting for happens: a publish, a settlement, a Close.
	changed chan struct{}
}

type pendingMsg struct {
	index    int
	attempts int
	// gen counts hand-outs, so that a delivery can tell it is stale.
	gen uint64
	// holder is the stream the message is handed out to, nil while it
	// waits to be handed out again.
	holder *stream
	// at is when the holder's AckWait ends, or, without a holder, when
	// the message may be handed out again.
	at time.Time
}

// NewTransport returns an empty Transport. cfg may be nil; fields that are
// zero or negative take their defaults.
func NewTransport(cfg *TransportConfig) *Transport {
	var c TransportConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 1000
	}
	if c.Poll <= 0 {
		c.Poll = 10 * time.Millisecond
	}
	return &Transport{
		clock:       c.Clock,
		ackWait:     c.AckWait,
		maxInFlight: c.MaxInFlight,
		poll:        c.Poll,
		topics:      make(map[string]*topicLog),
		streams:     make(map[*stream]struct{}),
	}
}

// Publish implements idem.Publisher. Messages are copied; a zero
// Message.Time is set to the clock's time. Returns an error matching
// idem.ErrInvalidArgument, having published nothing, when a message does
// not validate, and idem.ErrClosed after Close.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	for _, m := range msgs {
		if err := m.Validate(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return idem.ErrClosed
	}
	touched := make(map[*topicLog]bool)
	for _, m := range msgs {
		m = copyMessage(m)
		if m.Time.IsZero() {
			m.Time = now
		}
		l := t.topic(m.Topic)
		l.msgs = append(l.msgs, m)
		touched[l] = true
	}
	for l := range touched {
		for _, c := range l.consumers {
			c.signal()
		}
	}
	return nil
}

// topic returns the log of name, creating it. t.mu is held.
func (t *Transport) topic(name string) *topicLog {
	l := t.topics[name]
	if l == nil {
		l = &topicLog{consumers: make(map[string]*memConsumer)}
		t.topics[name] = l
	}
	return l
}

// Subscribe implements idem.Subscriber. Returns an error matching
// idem.ErrInvalidArgument when sub has no Topic or Consumer, or a negative
// AckWait or MaxInFlight, and idem.ErrClosed after Close.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	if err := sub.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if sub.AckWait == 0 {
		sub.AckWait = t.ackWait
	}
	if sub.MaxInFlight == 0 {
		sub.MaxInFlight = t.maxInFlight
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, idem.ErrClosed
	}
	l := t.topic(sub.Topic)
	c := l.consumers[sub.Consumer]
	if c == nil {
		c = &memConsumer{log: l, pending: make(map[int]*pendingMsg), changed: make(chan struct{})}
		l.consumers[sub.Consumer] = c
	}
	s := &stream{t: t, c: c, sub: sub, done: make(chan struct{})}
	t.streams[s] = struct{}{}
	return s, nil
}

// Close closes every stream and makes Publish and Subscribe return
// idem.ErrClosed, as do the methods of deliveries not yet settled. What
// was published is dropped with the Transport. Closing twice is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	for s := range t.streams {
		s.closeLocked()
	}
	return nil
}

// signal wakes every Next waiting on c. t.mu is held.
func (c *memConsumer) signal() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// take hands out the oldest message s may have at now, or returns nil and
// whether a later look at the clock may find one. t.mu is held.
func (c *memConsumer) take(s *stream, now time.Time) (*delivery, bool) {
	timed := false
	var best *pendingMsg
	for _, p := range c.pending {
		if p.holder != nil && !now.Before(p.at) {
			// The holder's AckWait has ended: the message may go to
			// anyone again.
			p.holder = nil
			c.inFlight--
		}
		if p.holder != nil || now.Before(p.at) {
			timed = true
			continue
		}
		if best == nil || p.index < best.index {
			best = p
		}
	}
	if c.inFlight >= s.sub.MaxInFlight {
		return nil, timed
	}
	if c.next < len(c.log.msgs) && (best == nil || c.next < best.index) {
		best = &pendingMsg{index: c.next}
		c.pending[c.next] = best
		c.next++
	}
	if best == nil {
		return nil, timed
	}
	best.attempts++
	best.gen++
	best.holder = s
	best.at = now.Add(s.sub.AckWait)
	c.inFlight++
	return &delivery{
		s:       s,
		p:       best,
		gen:     best.gen,
		attempt: best.attempts,
		msg:     copyMessage(c.log.msgs[best.index]),
	}, timed
}

type stream struct {
	t   *Transport
	c   *memConsumer
	sub idem.Subscription
	// done is closed by Close; closed is set with it, under t.mu.
	done   chan struct{}
	closed bool
}

// Next implements idem.Stream.
func (s *stream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.next(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

// NextBatch implements idem.BatchStream.
func (s *stream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	return s.next(ctx, max)
}

// AckBatch implements idem.BatchStream. In the Tx ctx carries, the
// acknowledgements are applied when it commits, each only if its delivery
// still stands for its message then; the count is of those that did when
// AckBatch was called.
func (s *stream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	own, err := s.own(ds)
	if err != nil {
		return 0, err
	}
	ack := func() int {
		s.t.mu.Lock()
		defer s.t.mu.Unlock()
		n := 0
		for _, d := range own {
			if d.currentLocked() == nil {
				d.settleLocked(func(c *memConsumer, _ time.Time) { delete(c.pending, d.p.index) })
				n++
			}
		}
		return n
	}
	tx, ok := TxFromContext(ctx)
	if !ok {
		if s.t.isClosed() {
			return 0, fmt.Errorf("ack: %w", idem.ErrClosed)
		}
		return ack(), nil
	}
	s.t.mu.Lock()
	n := 0
	for _, d := range own {
		if d.currentLocked() == nil {
			n++
		}
	}
	closed := s.t.closed
	s.t.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("ack: %w", idem.ErrClosed)
	}
	return n, tx.OnCommit(func() { ack() })
}

// own returns ds as this stream's deliveries, or an *idem.ArgumentError
// naming the first that is not one.
func (s *stream) own(ds []idem.Delivery) ([]*delivery, error) {
	own := make([]*delivery, len(ds))
	for i, d := range ds {
		md, ok := d.(*delivery)
		if !ok || md.s != s {
			return nil, &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		own[i] = md
	}
	return own, nil
}

// InProgressBatch implements idem.BatchRenewer: InProgress for each
// delivery, all under one hold of the transport's lock. Like InProgress, it
// does not join the Tx ctx carries.
func (s *stream) InProgressBatch(ctx context.Context, ds []idem.Delivery) ([]int, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	own, err := s.own(ds)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	if s.t.closed {
		return nil, fmt.Errorf("in progress: %w", idem.ErrClosed)
	}
	now := s.t.clock.Now()
	var stale []int
	for i, d := range own {
		if !d.renewLocked(now) {
			stale = append(stale, i)
		}
	}
	return stale, nil
}

// AcksInTx implements idem.BatchStream: AckBatch joins the Tx ctx carries.
func (s *stream) AcksInTx(ctx context.Context) bool {
	_, ok := TxFromContext(ctx)
	return ok
}

// next hands out up to max messages, waiting for the first.
func (s *stream) next(ctx context.Context, max int) ([]idem.Delivery, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	deadline, hasDeadline := ctx.Deadline()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// A deadline ends ctx through a timer, which a loaded machine
		// runs late: past it, the caller has stopped waiting even when
		// ctx does not say so yet, and a message handed out now would
		// count an attempt for nobody.
		if hasDeadline && !time.Now().Before(deadline) {
			return nil, context.DeadlineExceeded
		}
		s.t.mu.Lock()
		if s.closed {
			s.t.mu.Unlock()
			return nil, idem.ErrClosed
		}
		var ds []idem.Delivery
		now := s.t.clock.Now()
		d, timed := s.c.take(s, now)
		for d != nil {
			ds = append(ds, d)
			if len(ds) == max {
				break
			}
			d, _ = s.c.take(s, now)
		}
		changed := s.c.changed
		s.t.mu.Unlock()
		if len(ds) > 0 {
			return ds, nil
		}
		var tick <-chan time.Time
		if timed {
			if timer == nil {
				timer = time.NewTimer(s.t.poll)
			} else {
				timer.Reset(s.t.poll)
			}
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, idem.ErrClosed
		case <-changed:
		case <-tick:
		}
	}
}

// Close implements idem.Stream: the messages the stream holds go back to
// its consumer name at once, for its other streams or its next one.
func (s *stream) Close() error {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	s.closeLocked()
	return nil
}

// closeLocked closes s. s.t.mu is held.
func (s *stream) closeLocked() {
	if s.closed {
		return
	}
	s.closed = true
	close(s.done)
	delete(s.t.streams, s)
	now := s.t.clock.Now()
	for _, p := range s.c.pending {
		if p.holder == s {
			p.holder, p.at = nil, now
			s.c.inFlight--
		}
	}
	s.c.signal()
}

type delivery struct {
	s       *stream
	p       *pendingMsg
	gen     uint64
	attempt int
	msg     idem.Message
}

// Message implements idem.Delivery. The message is the delivery's own copy.
func (d *delivery) Message() idem.Message { return d.msg }

// Attempt implements idem.Delivery.
func (d *delivery) Attempt() int { return d.attempt }

// Ack implements idem.Delivery.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func(c *memConsumer, _ time.Time) {
		delete(c.pending, d.p.index)
	})
}

// Nack implements idem.Delivery. A negative delay is refused
// (idem.ValidateNackDelay).
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := idem.ValidateNackDelay(delay); err != nil {
		return err
	}
	return d.settle(ctx, "nack", func(_ *memConsumer, now time.Time) {
		d.p.at = now.Add(delay)
	})
}

// Term implements idem.Delivery.
func (d *delivery) Term(ctx context.Context) error {
	return d.settle(ctx, "term", func(c *memConsumer, _ time.Time) {
		delete(c.pending, d.p.index)
	})
}

// InProgress implements idem.Delivery: the delivery's AckWait starts
// again.
func (d *delivery) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := d.s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := d.currentLocked(); err != nil {
		return fmt.Errorf("in progress: %w", err)
	}
	if !d.renewLocked(t.clock.Now()) {
		return fmt.Errorf("in progress: message %q: %w", d.msg.ID, ErrStaleDelivery)
	}
	return nil
}

// renewLocked starts d's AckWait again at now, and reports whether it
// could: not once d no longer stands for its message, nor once its AckWait
// has ended (the next holder may already be working on the message). t.mu
// is held and the transport is not closed.
func (d *delivery) renewLocked(now time.Time) bool {
	if d.s.c.pending[d.p.index] != d.p || d.p.gen != d.gen || d.p.holder != d.s || !now.Before(d.p.at) {
		return false
	}
	d.p.at = now.Add(d.s.sub.AckWait)
	return true
}

// currentLocked returns nil when d still stands for its message. t.mu is
// held.
func (d *delivery) currentLocked() error {
	if d.s.t.closed {
		return idem.ErrClosed
	}
	if d.s.c.pending[d.p.index] != d.p || d.p.gen != d.gen {
		return fmt.Errorf("message %q: %w", d.msg.ID, ErrStaleDelivery)
	}
	return nil
}

// settle takes the message out of the consumer's in-flight set and applies
// what, then wakes the waiting Nexts. A delivery whose AckWait has ended, or
// whose stream was closed, may still be settled as long as the message has
// not been handed out again.
func (d *delivery) settle(ctx context.Context, op string, what func(c *memConsumer, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := d.s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := d.currentLocked(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	d.settleLocked(what)
	return nil
}

// settleLocked settles d, which stands for its message. t.mu is held.
func (d *delivery) settleLocked(what func(c *memConsumer, now time.Time)) {
	c := d.s.c
	if d.p.holder != nil {
		d.p.holder = nil
		c.inFlight--
	}
	// Bump the generation so that a second settlement of this delivery is
	// refused even when the message stays pending (Nack).
	d.p.gen++
	what(c, d.s.t.clock.Now())
	c.signal()
}
