package idemnats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
)

// The bodies of acknowledgements, as JetStream reads them.
var (
	ackAck      = []byte("+ACK")
	ackNak      = []byte("-NAK")
	ackTerm     = []byte("+TERM")
	ackProgress = []byte("+WPI")
)

// Timings of pull requests.
const (
	// minPull is the shortest pull request worth sending: a Next with
	// less time left waits it out.
	minPull = time.Millisecond
	// pullGrace is how long after a pull request's expiry its end (a 408
	// status) may take to arrive before the request is given up.
	pullGrace = time.Second
	// giveBackWait bounds each round trip of handing back what a
	// withdrawn pull request received.
	giveBackWait = time.Second
	// flushWait bounds a flush or a confirmation when ctx has no
	// deadline.
	flushWait = 5 * time.Second
)

type stream struct {
	t    *Transport
	cons jetstream.Consumer
	// next is the subject of the consumer's pull requests.
	next string
	// maxBatch is the consumer's MaxAckPending, more than the server
	// hands out at once.
	maxBatch int
	// ctx is cancelled by Close, which ends a waiting Next.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// held maps the stream sequence of each message this stream handed
	// out and has not settled to its latest delivery, so that an earlier
	// one, superseded after its AckWait, is known to be stale.
	held map[uint64]*delivery
	// ready holds the messages pull requests brought and no caller has
	// taken yet, oldest first.
	ready []*nats.Msg
	// pulling is set while the stream's pull request is out, or what it
	// brought for nobody is being handed back: one at a time, so that
	// the messages keep their order.
	pulling bool
	// plain makes the next request one without no_wait, for one message.
	plain bool
	// callers counts the Next and NextBatch calls waiting.
	callers int
	// failure is an error of the last request, for a waiting caller.
	failure error
	// changed is closed, and replaced, when any of the above changes.
	changed chan struct{}
}

// Next implements idem.Stream. It sends a pull request for one message
// when called, so a message is delivered (and its AckWait starts) only
// when a caller asks for it. The request expires before ctx's deadline;
// one whose caller has gone stays with the stream, for its next caller
// (see the package documentation).
func (s *stream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.take(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

// NextBatch implements idem.BatchStream with one pull request for up to
// max messages, which the server answers as soon as it has one, with the
// others available then (up to max). Returns an *idem.ArgumentError when
// max is below 1.
func (s *stream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	return s.take(ctx, min(max, s.maxBatch))
}

// AcksInTx implements idem.BatchStream: a broker cannot join a database
// transaction.
func (s *stream) AcksInTx(context.Context) bool { return false }

// signal wakes the waiting callers. s.mu is held.
func (s *stream) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// take waits until the stream's pull requests have brought messages, and
// hands out up to max of them: once it has max, or once the request that
// brought them has ended, so that a batch holds what was available
// together.
func (s *stream) take(ctx context.Context, max int) ([]idem.Delivery, error) {
	s.mu.Lock()
	s.callers++
	defer func() {
		s.callers--
		back := s.idle()
		s.mu.Unlock()
		s.giveBackLater(back)
	}()
	for {
		if s.ctx.Err() != nil {
			return nil, idem.ErrClosed
		}
		// A caller whose ctx has ended takes what has arrived rather than
		// leave it to be handed back, which would count a delivery.
		if n := len(s.ready); n > 0 && (n >= max || !s.pulling || ctx.Err() != nil) {
			if ds := s.handOut(max); len(ds) > 0 {
				return ds, nil
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := s.failure; err != nil {
			s.failure = nil
			return nil, err
		}
		if !s.pulling {
			// With too little time left for a pull, ctx is waited out.
			if expires, ok := s.expires(ctx); ok {
				if err := s.request(max, expires); err != nil {
					return nil, s.failed(ctx, err)
				}
			}
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		s.mu.Lock()
	}
}

// handOut takes up to max messages from s.ready as deliveries. s.mu is
// held.
func (s *stream) handOut(max int) []idem.Delivery {
	n := min(max, len(s.ready))
	msgs := s.ready[:n]
	s.ready = s.ready[n:]
	if len(s.ready) == 0 {
		s.ready = nil
	}
	ds := make([]idem.Delivery, 0, len(msgs))
	for _, m := range msgs {
		d, err := s.delivery(m)
		if err != nil {
			continue // not a JetStream message: nothing to settle
		}
		s.held[d.seq] = d
		ds = append(ds, d)
	}
	return ds
}

// idle returns, when no caller waits and no request is out, the messages
// a request brought that no caller took (a request for more than its
// last caller wanted), for giveBackLater, and counts their hand-back as
// pulling. s.mu is held.
func (s *stream) idle() []*nats.Msg {
	if s.callers > 0 || s.pulling || len(s.ready) == 0 {
		return nil
	}
	back := s.ready
	s.ready = nil
	s.pulling = true
	return back
}

// giveBackLater hands back what idle returned, in a goroutine, or at once
// when the Transport is closing. s.mu is not held.
func (s *stream) giveBackLater(back []*nats.Msg) {
	if len(back) > 0 && !s.t.background(func() { s.giveBack(back) }) {
		s.giveBack(back)
	}
}

// expires returns how long the next pull request may wait: PollWait, or
// less when ctx's deadline comes sooner, so that the server ends the
// request, and its answer arrives, before the deadline. ok is false when
// too little time is left for a pull.
func (s *stream) expires(ctx context.Context) (d time.Duration, ok bool) {
	d = s.t.cfg.PollWait
	if dl, has := ctx.Deadline(); has {
		left := time.Until(dl)
		left -= min(max(left/10, time.Millisecond), time.Second)
		if left < minPull {
			return 0, false
		}
		d = min(d, left)
	}
	return d, true
}

// failed wraps an error of the connection.
func (s *stream) failed(ctx context.Context, err error) error {
	if s.ctx.Err() != nil {
		return idem.ErrClosed
	}
	if e := ctx.Err(); e != nil {
		return e
	}
	if errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("idemnats: next: %w (%w)", idem.ErrClosed, err)
	}
	return fmt.Errorf("idemnats: next: %w", err)
}

// pullRequest is the body of a pull request.
type pullRequest struct {
	Batch   int           `json:"batch"`
	Expires time.Duration `json:"expires,omitempty"`
	NoWait  bool          `json:"no_wait,omitempty"`
}

// pull is a pull request that is out.
type pull struct {
	sub     *nats.Subscription
	answers chan *nats.Msg
	batch   int
	expires time.Duration
	noWait  bool
}

// request sends a pull request for up to batch messages, waiting up to
// expires for the first, and starts the goroutine that collects its
// answer. A no_wait request with an expiry ends as soon as it has
// delivered what was available; a request without no_wait would wait to
// fill its batch, so it asks for one message. s.mu is held.
func (s *stream) request(batch int, expires time.Duration) error {
	p := &pull{batch: batch, expires: expires, noWait: batch > 1 && !s.plain}
	if !p.noWait {
		p.batch = 1
	}
	s.plain = false
	body, err := json.Marshal(pullRequest{Batch: p.batch, Expires: expires, NoWait: p.noWait})
	if err != nil {
		return err
	}
	nc := s.t.nc
	inbox := nc.NewInbox()
	// Room for every message of the batch and the status that ends it,
	// so that the connection never finds the channel full.
	p.answers = make(chan *nats.Msg, p.batch+2)
	if p.sub, err = nc.ChanSubscribe(inbox, p.answers); err != nil {
		return err
	}
	if err := nc.PublishRequest(s.next, inbox, body); err != nil {
		_ = p.sub.Unsubscribe()
		return err
	}
	if !s.t.background(func() { s.collect(p) }) {
		_ = p.sub.Unsubscribe()
		return idem.ErrClosed
	}
	s.pulling = true
	return nil
}

// collect takes p's answers into s.ready until the server ends p, however
// long its callers wait. When it has ended, what it brought and no caller
// waits for is handed back at once; until then nothing is, since a NAKed
// message could come back to p itself, and p can be withdrawn only with a
// risk (see withdraw). p is withdrawn when the stream closes, and given up
// when its end (a 408 status) does not arrive.
func (s *stream) collect(p *pull) {
	expiry := time.NewTimer(p.expires + pullGrace)
	defer expiry.Stop()
	got := 0
	var failure error
	withdrawn := false
loop:
	for {
		select {
		case m := <-p.answers:
			code, desc := status(m)
			switch {
			case code == "":
				got++
				s.mu.Lock()
				s.ready = append(s.ready, m)
				s.signal()
				s.mu.Unlock()
				if got == p.batch {
					break loop
				}
				continue
			case code == "100": // a heartbeat or flow control: not asked for
				continue
			case code == "408" && got == 0 && strings.Contains(desc, "Requests Pending"):
				// Other pull requests of the consumer wait for more than
				// there is, and the server refuses a no_wait one then.
				s.mu.Lock()
				s.plain = true
				s.mu.Unlock()
			case code == "404" || code == "408":
				// Expired, or nothing more available.
			case code == "409" && (strings.Contains(desc, "Leadership Change") || strings.Contains(desc, "Server Shutdown")):
				// The next request finds the new state.
			case code == "503":
				failure = fmt.Errorf("idemnats: next: %w", nats.ErrNoResponders)
			default:
				failure = fmt.Errorf("idemnats: next: the server answered the pull request with %s %s", code, desc)
			}
			break loop
		case <-expiry.C:
			break loop // the server expired it: its end was lost
		case <-s.ctx.Done():
			withdrawn = true
			break loop
		}
	}
	if withdrawn {
		s.withdraw(p)
	} else {
		_ = p.sub.Unsubscribe()
	}
	s.mu.Lock()
	if failure != nil && s.callers > 0 {
		s.failure = failure
	}
	var back []*nats.Msg
	if s.callers == 0 || s.ctx.Err() != nil {
		back, s.ready = s.ready, nil
	}
	if len(back) == 0 {
		s.pulling = false
		s.signal()
	}
	s.mu.Unlock()
	if len(back) > 0 {
		s.giveBack(back)
	}
}

// withdraw ends p before the server has: unsubscribing its reply subject
// makes the server drop the request (it delivers to no request without
// interest), and a round trip later whatever it had sent before that has
// arrived, into s.ready. The consumer's info is asked for next, because
// answering it makes the server drop waiting requests without interest
// at once: nats-server before 2.10.14, finding a redelivery due and only
// such a request waiting, delivers the stream's previous message again as
// new and loses the redelivery until its AckWait (nats-server#5305).
func (s *stream) withdraw(p *pull) {
	if err := p.sub.Drain(); err != nil {
		return // the connection is closed: nothing more comes
	}
	_ = s.t.nc.FlushTimeout(giveBackWait)
	ctx, cancel := context.WithTimeout(context.Background(), giveBackWait)
	_, _ = s.cons.Info(ctx)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		select {
		case m := <-p.answers:
			if code, _ := status(m); code == "" {
				s.ready = append(s.ready, m)
			}
			continue
		default:
		}
		return
	}
}

// giveBack hands msgs, brought for nobody, back to the server with a NAK,
// so that they are delivered again at once, and then lets the stream pull
// again. The server answers the last NAK once it has processed it, and
// processes a consumer's acknowledgements in order: the messages are due
// for redelivery before any later request of the stream is served, so
// they keep their place in the order. The server has counted those
// deliveries.
func (s *stream) giveBack(msgs []*nats.Msg) {
	nc := s.t.nc
	for _, m := range msgs[:len(msgs)-1] {
		_ = nc.Publish(m.Reply, ackNak)
	}
	_, _ = nc.Request(msgs[len(msgs)-1].Reply, ackNak, giveBackWait)
	s.mu.Lock()
	s.pulling = false
	s.signal()
	s.mu.Unlock()
}

// status returns the status code and description of a status message
// (one without payload and with a Status header), or "" for a message.
func status(m *nats.Msg) (code, desc string) {
	if len(m.Data) > 0 || len(m.Header) == 0 {
		return "", ""
	}
	return m.Header.Get("Status"), m.Header.Get("Description")
}

// current reports whether d is the latest delivery of its message this
// stream handed out, and not settled.
func (s *stream) current(d *delivery) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[d.seq] == d
}

// forget removes d, settled, from the held deliveries.
func (s *stream) forget(d *delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[d.seq] == d {
		delete(s.held, d.seq)
	}
}

// Close implements idem.Stream. The consumer stays on the server, so the
// messages this stream handed out unsettled are delivered again when
// their AckWait ends, to this consumer name's other or next streams. A
// Next waiting in Close's moment returns idem.ErrClosed; the stream's pull
// request is withdrawn, and what it brought handed back at once, in the
// background (Transport.Close waits for it).
func (s *stream) Close() error {
	s.cancel()
	s.mu.Lock()
	back := s.idle()
	s.mu.Unlock()
	s.giveBackLater(back)
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	delete(s.t.streams, s)
	return nil
}

func (s *stream) delivery(msg *nats.Msg) (*delivery, error) {
	md, err := msg.Metadata()
	if err != nil {
		return nil, err
	}
	h := msg.Header
	m := idem.Message{
		ID:      h.Get(headerMsgID),
		Topic:   s.t.topic(msg.Subject),
		Key:     h.Get(HeaderKey),
		Payload: msg.Data,
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
	return &delivery{s: s, reply: msg.Reply, m: m, attempt: int(md.NumDelivered), seq: md.Sequence.Stream}, nil
}

// AckBatch implements idem.BatchStream: every delivery of ds that still
// stands for its message is acknowledged, all at once, with one round
// trip for the batch: plain acks for all but the last, then a double ack
// for the last, whose confirmation confirms them all, since the server
// processes a consumer's acknowledgements one at a time in the order they
// arrive (nats-server queues them so, from 2.9 to the current 2.x), and
// one connection's arrive in the order sent. When AckBatch returns n, nil,
// the server has recorded the n acknowledgements.
//
// A delivery settled already, or superseded by a later delivery of its
// message to this stream (after its AckWait), is passed over; one
// superseded by a delivery to another stream cannot be told, and its
// acknowledgement settles the message, as JetStream acknowledges by
// stream sequence. Deliveries of another stream are refused with an error
// matching idem.ErrInvalidArgument. On any other error (ctx done, or 5s
// passed when ctx has no deadline, before the confirmation came) AckBatch
// returns 0: some acknowledgements may be recorded, none is counted, and
// the deliveries stay unsettled here, so that acknowledging them again is
// possible and safe.
func (s *stream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	own := make([]*delivery, len(ds))
	for i, d := range ds {
		nd, ok := d.(*delivery)
		if !ok || nd.s != s {
			return 0, &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		own[i] = nd
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	claimed := make([]*delivery, 0, len(own))
	for _, d := range own {
		if d.claim("ack") == nil {
			claimed = append(claimed, d)
		}
	}
	if len(claimed) == 0 {
		return 0, nil
	}
	err := s.ackAll(ctx, claimed)
	for _, d := range claimed {
		d.release(err == nil)
	}
	if err != nil {
		return 0, err
	}
	return len(claimed), nil
}

// ackAll sends plain acks for ds but the last, and a double ack for the
// last, and waits for its confirmation.
func (s *stream) ackAll(ctx context.Context, ds []*delivery) error {
	nc := s.t.nc
	last := ds[len(ds)-1]
	for _, d := range ds[:len(ds)-1] {
		if err := nc.Publish(d.reply, ackAck); err != nil {
			return fmt.Errorf("idemnats: ack: message %q: %w", d.m.ID, err)
		}
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	r, err := nc.RequestWithContext(ctx, last.reply, ackAck)
	if err == nil {
		if code, desc := status(r); code != "" {
			err = fmt.Errorf("the server answered %s %s", code, desc)
		}
	}
	if err != nil {
		return fmt.Errorf("idemnats: ack: %d messages, confirming the last, %q: %w", len(ds), last.m.ID, err)
	}
	return nil
}

// bounded returns ctx, with the deadline flushWait when it has none.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, flushWait)
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
	// reply is the message's acknowledgement subject.
	reply   string
	m       idem.Message
	attempt int
	// seq is the message's stream sequence.
	seq uint64

	mu    sync.Mutex
	state deliveryState
}

// Message implements idem.Delivery.
func (d *delivery) Message() idem.Message { return d.m }

// Attempt implements idem.Delivery: the consumer's NumDelivered for the
// message, which the server keeps across streams and restarts.
func (d *delivery) Attempt() int { return d.attempt }

// claim starts settling d, or returns ErrStaleDelivery when d is settled
// or being settled, or superseded by a later delivery of its message.
func (d *delivery) claim(op string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != open || !d.s.current(d) {
		return fmt.Errorf("idemnats: %s: message %q: %w", op, d.m.ID, ErrStaleDelivery)
	}
	d.state = settling
	return nil
}

// release ends what claim started: d is settled, or open again after a
// failure.
func (d *delivery) release(done bool) {
	d.mu.Lock()
	if done {
		d.state = settled
	} else {
		d.state = open
	}
	d.mu.Unlock()
	if done {
		d.s.forget(d)
	}
}

// Ack implements idem.Delivery with a double ack: it returns once the
// server has recorded the acknowledgement, so a message Ack has settled
// is not delivered again.
func (d *delivery) Ack(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.claim("ack"); err != nil {
		return err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	r, err := d.s.t.nc.RequestWithContext(ctx, d.reply, ackAck)
	if err == nil {
		if code, desc := status(r); code != "" {
			err = fmt.Errorf("the server answered %s %s", code, desc)
		}
	}
	d.release(err == nil)
	if err != nil {
		return fmt.Errorf("idemnats: ack: message %q: %w", d.m.ID, err)
	}
	return nil
}

// Nack implements idem.Delivery with a NAK, delayed by delay when it is
// positive: the server delivers the message again after it. The NAK is
// flushed to the server before Nack returns, though not confirmed; if it
// is lost the AckWait brings the message back.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := idem.ValidateNackDelay(delay); err != nil {
		return err
	}
	body := ackNak
	if delay > 0 {
		body = fmt.Appendf(nil, "%s {\"delay\": %d}", ackNak, delay.Nanoseconds())
	}
	return d.settle(ctx, "nack", body)
}

// Term implements idem.Delivery with a TERM: the server does not deliver
// the message to this consumer again. Flushed, not confirmed, as Nack.
func (d *delivery) Term(ctx context.Context) error {
	return d.settle(ctx, "term", ackTerm)
}

// InProgress implements idem.Delivery: the server starts the delivery's
// AckWait again.
func (d *delivery) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	stale := d.state == settled || !d.s.current(d)
	d.mu.Unlock()
	if stale {
		return fmt.Errorf("idemnats: in progress: message %q: %w", d.m.ID, ErrStaleDelivery)
	}
	if err := d.s.t.nc.Publish(d.reply, ackProgress); err != nil {
		return fmt.Errorf("idemnats: in progress: message %q: %w", d.m.ID, err)
	}
	return d.flush(ctx, "in progress")
}

// settle sends body, a NAK or a TERM, and flushes it.
func (d *delivery) settle(ctx context.Context, op string, body []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.claim(op); err != nil {
		return err
	}
	if err := d.s.t.nc.Publish(d.reply, body); err != nil {
		d.release(false)
		return fmt.Errorf("idemnats: %s: message %q: %w", op, d.m.ID, err)
	}
	d.release(true)
	return d.flush(ctx, op)
}

// flush waits until the server has read what was sent, so a settlement
// is not left in a client buffer.
func (d *delivery) flush(ctx context.Context, op string) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	if err := d.s.t.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("idemnats: %s: message %q: flush: %w", op, d.m.ID, err)
	}
	return nil
}
