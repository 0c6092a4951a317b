package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// settleTimeout bounds an Ack, Nack or Term. Settlements use a context that
// outlives Run's, because a handler that committed just as Run was
// cancelled should still be acknowledged: that spares a redelivery.
const settleTimeout = 10 * time.Second

// errHeld rolls back the inbox transaction of a message whose key turned
// out to be held back: the message is parked instead, and must leave no
// inbox row.
var errHeld = errors.New("consumer: key held back")

// entry is one message the consumer holds in memory, from its delivery to
// its settlement.
type entry struct {
	// Set at admission, then read-only.
	msg   idem.Message
	dedup string
	// dedupErr says why the message cannot be de-duplicated: its dedup
	// key, or its aggregate and sequence number, could not be derived.
	dedupErr  error
	aggregate string // with Config.Sequence: what the inbox
	seq       uint64 // de-duplicates by
	ordered   bool   // msg.Key != "" and not Unordered: one at a time, in order, with its key
	d         idem.Delivery

	// Guarded by runner.mu.
	beatAt  time.Time   // when the transport last heard about d: handed it out (admit), or renewed it
	waiting bool        // waiting for an in-process retry
	stop    func() bool // stops the retry timer while waiting
	// stale is set once the heartbeat's InProgress was refused as stale
	// (idem.ErrStaleDelivery): the refusal is for good, so d is renewed no
	// more, and, at the head of its key with a later delivery of its
	// message behind it, it is let go unhandled (superseded).
	stale bool
	// excused counts the earlier deliveries of e's message whose AckWait
	// lapsed while the consumer held them unattempted (or with their
	// failed attempts recorded), each let go, superseded, for the next, up
	// to e (letGo). They count neither towards MaxDeliveries nor towards
	// the attempt number (delivered). Written by letGo, under mu, only
	// while e waits behind its key's head and before e is made ready: the
	// worker that takes e up, or gathers it behind its head, reads it
	// after, without mu.
	excused int

	// Owned by whichever worker handles the entry; the ready channel hands
	// it from one to the next.
	last      int  // number of the last attempt that failed in this process
	failed    bool // attempts were recorded in the ledger: forget them on success
	loaded    bool // the ledger's attempts were read once
	prevDelay time.Duration
	obs       observation // the handling Config.Observer sees
}

// runner is one Run: the deliveries in memory, their per-key queues, and
// the goroutines that move them along.
type runner struct {
	c      *Consumer
	cfg    *Config
	h      handlers
	ctx    context.Context
	cancel context.CancelFunc
	stream idem.Stream

	// slots holds one token per delivery in memory; a full slots is the
	// backpressure that stops the reader from calling Next.
	slots chan struct{}
	// ready holds entries a worker may take. Its capacity is MaxPending and
	// an entry is in it at most once, so sending never blocks.
	ready     chan *entry
	beatEvery time.Duration

	mu     sync.Mutex
	closed bool
	// held is every entry in memory.
	held map[*entry]struct{}
	// lanes holds, per ordering key, the key's entries in delivery order.
	// Only the head is ever ready, running or waiting for a retry; a batch
	// may also hold entries behind it, which only its worker touches.
	lanes map[string][]*entry
	// taking is set while the reader takes deliveries from the transport,
	// until it has put them in memory (admit); letGoWhileTaking holds, by
	// key, the heads let go meanwhile (letGo), whose key-mates among those
	// deliveries are handed back as the ones held are.
	taking           bool
	letGoWhileTaking map[string]*letGone

	// batchInbox is the inbox when it records batches and BatchSize
	// allows them; nil otherwise. batchStream is the stream when it hands
	// out batches; batchLedger the ledger when it looks up many holds at
	// once.
	batchInbox  idem.BatchInbox
	batchStream idem.BatchStream
	batchLedger idem.BatchLedger
	// renewer is the stream when it renews many deliveries in one round
	// trip: the heartbeat then renews all it holds with one call a beat.
	renewer idem.BatchRenewer
	// seqInbox is the inbox when Config.Sequence is set: messages are
	// de-duplicated by aggregate and sequence number, one at a time.
	seqInbox idem.SequenceInbox
}

func newRunner(ctx context.Context, cancel context.CancelFunc, c *Consumer, h handlers, stream idem.Stream) *runner {
	r := &runner{
		c:         c,
		cfg:       &c.cfg,
		h:         h,
		ctx:       ctx,
		cancel:    cancel,
		stream:    stream,
		slots:     make(chan struct{}, c.cfg.MaxPending),
		ready:     make(chan *entry, c.cfg.MaxPending),
		beatEvery: max(c.cfg.AckWait/4, time.Millisecond),
		held:      make(map[*entry]struct{}),
		lanes:     make(map[string][]*entry),
	}
	if c.cfg.Sequence != nil {
		// New checked that it is one. Each message needs its own look at
		// its aggregate's mark, so there are no batches.
		r.seqInbox = c.cfg.Inbox.(idem.SequenceInbox)
	} else if bi, ok := c.cfg.Inbox.(idem.BatchInbox); ok && c.cfg.BatchSize > 1 {
		r.batchInbox = bi
	}
	r.batchStream, _ = stream.(idem.BatchStream)
	r.renewer, _ = stream.(idem.BatchRenewer)
	r.batchLedger, _ = c.cfg.Ledger.(idem.BatchLedger)
	return r
}

// run takes deliveries until the context is done or the stream fails, then
// waits for the workers and stops the timers.
func (r *runner) run() error {
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(r.work)
	}
	wg.Go(r.heartbeat)
	err := r.read()
	r.cancel()
	wg.Wait()

	r.mu.Lock()
	r.closed = true
	for e := range r.held {
		if e.waiting {
			e.stop()
		}
	}
	r.mu.Unlock()
	return err
}

// read admits deliveries while there is room for them: as many at once as
// there is room for, up to BatchSize, from a transport that hands out
// batches (idem.BatchStream), one at a time from any other.
func (r *runner) read() error {
	chunk := 1
	if r.batchStream != nil {
		chunk = r.cfg.BatchSize
	}
	for {
		select {
		case r.slots <- struct{}{}:
		case <-r.ctx.Done():
			return nil
		}
		n := 1
	room:
		for n < chunk {
			select {
			case r.slots <- struct{}{}:
				n++
			default:
				break room
			}
		}
		r.mu.Lock()
		r.taking = true
		r.mu.Unlock()
		ds, err := r.next(n)
		// The transport's AckWait runs from here, not from admit: the
		// renewals are counted from it, however long the reader takes to
		// put the deliveries in memory.
		taken := r.cfg.Clock.Now()
		for range n - len(ds) {
			<-r.slots
		}
		if err != nil {
			if r.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consumer %q: next delivery: %w", r.cfg.Name, err)
		}
		es := make([]*entry, len(ds))
		for i, d := range ds {
			m := d.Message()
			dedup, derr := r.dedupKey(m)
			e := &entry{msg: m, dedup: dedup, dedupErr: derr, ordered: m.Key != "" && !r.cfg.Unordered, d: d}
			if r.seqInbox != nil && derr == nil {
				e.aggregate, e.seq, e.dedupErr = r.sequence(m)
			}
			es[i] = e
		}
		r.handBack(r.admit(es, taken))
	}
}

// next takes up to n deliveries from the stream.
func (r *runner) next(n int) ([]idem.Delivery, error) {
	if r.batchStream != nil {
		return r.batchStream.NextBatch(r.ctx, n)
	}
	d, err := r.stream.Next(r.ctx)
	if err != nil {
		return nil, err
	}
	return []idem.Delivery{d}, nil
}

// errNotApplied rolls back the inbox's transaction of a message that was
// only looked up: the inbox has not seen it.
var errNotApplied = errors.New("consumer: not applied yet")

// overDelivered reports whether the transport has delivered e's message
// more often than MaxDeliveries, not counting the lapses the consumer
// excused (delivered).
func (r *runner) overDelivered(e *entry) bool {
	return r.cfg.MaxDeliveries > 0 && r.delivered(e) > r.cfg.MaxDeliveries
}

// delivered is the transport's count of e's deliveries (Delivery.Attempt)
// less the lapses excused (entry.excused): deliveries of its message that
// the consumer held unattempted (queued behind its key, or waiting for a
// retry the Ledger recorded) while the heartbeat came too late past the
// AckWait, each let go for the next. That is the consumer's own slowness,
// not a crash nor a poison message, and must not eat into MaxDeliveries
// nor Retry.MaxAttempts.
func (r *runner) delivered(e *entry) int {
	return max(e.d.Attempt()-e.excused, 1)
}

func (r *runner) dedupKey(m idem.Message) (key string, err error) {
	defer func() {
		if p := recover(); p != nil {
			key, err = "", fmt.Errorf("dedup key: panic: %v", p)
		}
	}()
	key, err = r.cfg.DedupKey(m)
	switch {
	case err != nil:
		return "", fmt.Errorf("dedup key: %w", err)
	case key == "":
		return "", errors.New("dedup key: empty")
	}
	return key, nil
}

// sequence derives m's aggregate and sequence number with Config.Sequence.
// Its errors make the message malformed: they are dead-lettered as
// permanent.
func (r *runner) sequence(m idem.Message) (aggregate string, seq uint64, err error) {
	defer func() {
		if p := recover(); p != nil {
			aggregate, seq, err = "", 0, fmt.Errorf("sequence: panic: %v", p)
		}
	}()
	aggregate, seq, err = r.cfg.Sequence(m)
	switch {
	case err != nil:
		return "", 0, fmt.Errorf("sequence: %w", err)
	case aggregate == "":
		return "", 0, errors.New("sequence: empty aggregate")
	case seq == 0:
		return "", 0, fmt.Errorf("sequence: aggregate %q: sequence number 0 (they start at 1)", aggregate)
	}
	return aggregate, seq, nil
}

// letGone is a head let go while the reader took deliveries (letGo).
type letGone struct {
	head *entry
	// handedBack is closed once the key-mates the consumer held are
	// handed back: those the reader took go back after them.
	handedBack chan struct{}
}

// admit puts deliveries in memory, each behind the earlier messages of its
// key, and returns those to hand back instead (handBack): the messages of a
// key whose head was let go while the reader took them (letGo), but for
// that head's later delivery, which is the key's head again. Put in memory,
// such a message would be the head of its key, and applied before the
// stale head's next delivery.
//
// taken is when the transport handed the deliveries out (Next returned),
// where its AckWait starts: their heartbeat counts from it (beatAt), so
// that a reader slow to admit them does not delay their first renewal
// past the AckWait's end.
func (r *runner) admit(es []*entry, taken time.Time) []*handedBack {
	var back []*handedBack
	r.mu.Lock()
	defer r.mu.Unlock()
	gone := r.letGoWhileTaking
	r.taking, r.letGoWhileTaking = false, nil
	// A delivery of a message the consumer already holds is not merged with
	// it, since nothing tells a redelivery (a heartbeat came too late) from
	// a copy published again under the same ID, which the transport
	// settles separately. It queues like any other; when its turn comes,
	// the inbox finds it a duplicate, or runs it if the first failed.
	for _, e := range es {
		if g, ok := gone[e.msg.Key]; ok && e.ordered {
			if !sameMessage(g.head, e) {
				back = append(back, &handedBack{e, g.handedBack})
				continue
			}
			delete(gone, e.msg.Key)
		}
		e.beatAt = taken
		r.held[e] = struct{}{}
		if !e.ordered {
			r.ready <- e
			continue
		}
		q := append(r.lanes[e.msg.Key], e)
		r.lanes[e.msg.Key] = q
		if len(q) == 1 {
			r.ready <- e
		}
	}
	return back
}

// handedBack is a delivery that admit did not put in memory, to hand back
// once after is closed.
type handedBack struct {
	e     *entry
	after chan struct{}
}

// handBack hands back (Nack, no delay) the deliveries that admit did not
// put in memory, in their order, each after the key-mates its stale head
// left (letGo), so that a transport that delivers again in the order of
// the NAKs keeps the key's order; then it gives their places back.
func (r *runner) handBack(back []*handedBack) {
	for _, b := range back {
		<-b.after
		d := b.e.d
		r.settleWith(b.e, d, "nack", func(ctx context.Context) error { return d.Nack(ctx, 0) })
	}
	for range back {
		<-r.slots
	}
}

// done takes e out of memory, lets the next message of its key go, and
// returns the delivery to settle.
func (r *runner) done(e *entry) idem.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, e)
	if e.ordered {
		q := r.lanes[e.msg.Key]
		if len(q) == 0 || q[0] != e {
			panic("consumer: settled an entry that is not the head of its key")
		}
		q[0] = nil
		q = q[1:]
		if len(q) == 0 {
			delete(r.lanes, e.msg.Key)
		} else {
			r.lanes[e.msg.Key] = q
			r.ready <- q[0]
		}
	}
	<-r.slots
	return e.d
}

func (r *runner) work() {
	for {
		select {
		case <-r.ctx.Done():
			return
		case e := <-r.ready:
			if r.ctx.Err() != nil {
				return
			}
			if r.superseded(e) {
				r.begin(e)
				r.letGo(e, "handled", true)
				continue
			}
			if r.batchInbox == nil || e.dedupErr != nil || r.overDelivered(e) {
				r.handle(e)
				continue
			}
			r.handleBatch(r.gather(e))
		}
	}
}

// superseded reports whether e, a ready head, is a delivery the heartbeat
// found stale (entry.stale) with a later delivery of its message behind it
// in its key: that later one stands for the message now (a redelivery, or
// a copy published again under the same ID, which the transport settles
// apart and the inbox finds a duplicate; letting the first copy go then
// costs one more delivery of it, which the inbox absorbs). Handled, e would take an inbox transaction and an
// acknowledgement the transport refuses, and under load each stale copy
// of the message (a heartbeat late past the AckWait, again and again)
// would take the head in turn, until the live delivery's own AckWait ended
// before its turn came and nothing of the key was ever acknowledged. It is
// let go instead (letGo), and the later delivery takes its place.
//
// A ready entry is not waiting for a retry (wake makes it ready once its
// wait is over), and a ready entry with a key is its key's head.
func (r *runner) superseded(e *entry) bool {
	if !e.ordered {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return supersededBy(e, r.lanes[e.msg.Key][1:])
}

// supersededBy reports whether e is stale and behind, the entries held
// after it in its key's lane, holds a later delivery of its message. r.mu
// is held.
func supersededBy(e *entry, behind []*entry) bool {
	return e.stale && slices.ContainsFunc(behind, func(f *entry) bool { return sameMessage(e, f) })
}

// heartbeat keeps the deliveries held in memory from being delivered again
// after AckWait. A delivery whose renewal the transport refused as stale
// is renewed no more (entry.stale): the refusal is for good. A stream that
// renews in batches (idem.BatchRenewer) is asked once a beat for every
// delivery due, the others once for each.
func (r *runner) heartbeat() {
	for {
		fired := make(chan struct{})
		stop := r.cfg.Timers.AfterFunc(r.beatEvery, func() { close(fired) })
		select {
		case <-r.ctx.Done():
			stop()
			return
		case <-fired:
		}
		now := r.cfg.Clock.Now()
		var due []*entry
		r.mu.Lock()
		for e := range r.held {
			if !e.stale && now.Sub(e.beatAt) >= r.beatEvery {
				due = append(due, e)
				e.beatAt = now
			}
		}
		r.mu.Unlock()
		if len(due) == 0 {
			continue
		}
		if r.renewer != nil {
			r.renewAll(due)
			continue
		}
		for _, e := range due {
			err := e.d.InProgress(r.ctx)
			if err == nil || r.ctx.Err() != nil {
				continue
			}
			r.c.log.LogAttrs(r.ctx, slog.LevelDebug, "in-progress heartbeat failed",
				slog.String("message_id", e.msg.ID), slog.String("error", err.Error()))
			if errors.Is(err, idem.ErrStaleDelivery) {
				r.mu.Lock()
				e.stale = true
				r.mu.Unlock()
			}
		}
	}
}

// renewAll renews the deliveries of due with one InProgressBatch and
// marks stale exactly those the stream refused as stale. A failure of the
// whole call says nothing of any delivery: none is marked, and the next
// beat asks for them all again, as it does after an InProgress that failed
// otherwise than stale.
func (r *runner) renewAll(due []*entry) {
	ds := make([]idem.Delivery, len(due))
	for i, e := range due {
		ds[i] = e.d
	}
	stale, err := r.renewer.InProgressBatch(r.ctx, ds)
	if err != nil {
		if r.ctx.Err() == nil {
			r.c.log.LogAttrs(r.ctx, slog.LevelDebug, "in-progress heartbeat failed",
				slog.Int("deliveries", len(ds)), slog.String("error", err.Error()))
		}
		return
	}
	var refused []*entry
	r.mu.Lock()
	for _, i := range stale {
		// An index that names no delivery of the call is the stream's
		// mistake, and tells nothing of any.
		if i < 0 || i >= len(due) {
			continue
		}
		due[i].stale = true
		refused = append(refused, due[i])
	}
	r.mu.Unlock()
	for _, e := range refused {
		r.c.log.LogAttrs(r.ctx, slog.LevelDebug, "in-progress heartbeat failed",
			slog.String("message_id", e.msg.ID), slog.String("error", idem.ErrStaleDelivery.Error()))
	}
}

// handle makes one attempt at e and settles it, or schedules its retry.
func (r *runner) handle(e *entry) {
	d := e.d
	octx := r.begin(e)
	if e.dedupErr != nil {
		r.fail(e, max(d.Attempt(), e.last+1, 1), e.dedupErr, idem.ClassPermanent)
		return
	}
	if r.overDelivered(e) {
		// A message delivered that often may be a copy of one applied
		// meanwhile: a transport redelivers what a slow consumer (a loaded
		// machine, heartbeats late) held past its ack wait, and a copy
		// attempted, or a copy of another holder, counts (only those let go
		// unattempted for a later one do not: delivered). Its inbox says
		// so; a duplicate is acknowledged, not dead-lettered (which would
		// park its key's later messages).
		if errors.Is(r.process(octx, e, func(context.Context) error { return errNotApplied }), idem.ErrDuplicate) {
			r.observe(e, OutcomeDuplicate, 1, nil)
			r.settle(e, "ack")
			r.c.duplicates.Add(1)
			return
		}
		// Past MaxDeliveries, and so past Retry.MaxAttempts, and never
		// applied: fail dead-letters it as exhausted, without running the
		// handler.
		r.fail(e, r.number(e), fmt.Errorf("delivered %d times with no outcome recorded (more than MaxDeliveries, %d): "+
			"the consumer may have stopped while handling it, a crash or an out-of-memory kill; the handler was not run again",
			r.delivered(e), r.cfg.MaxDeliveries), idem.ClassTransient)
		return
	}
	n := r.number(e)

	park := e.ordered && r.cfg.AfterDeadLetter == Park
	info := Info{Consumer: r.cfg.Name, DedupKey: e.dedup, Aggregate: e.aggregate, Seq: e.seq, Attempt: n}
	var held, failed bool
	var herr error
	err := r.process(context.WithValue(octx, infoKey{}, info), e, func(ctx context.Context) error {
		if park {
			// Checked in the inbox's transaction, to spare a round trip
			// on the common path where the key is not held.
			_, h, err := r.cfg.Ledger.HeldBack(ctx, r.cfg.Name, e.msg.Key)
			if err != nil {
				return fmt.Errorf("check whether the key is held back: %w", err)
			}
			if h {
				held = true
				return errHeld
			}
		}
		if herr = r.call(ctx, e); herr != nil {
			failed = true
			return herr
		}
		if e.failed || d.Attempt() > 1 {
			if err := r.cfg.Ledger.ForgetAttempts(ctx, r.cfg.Name, e.dedup); err != nil {
				return fmt.Errorf("forget recorded attempts: %w", err)
			}
		}
		return nil
	})
	switch {
	case held:
		r.park(e, n)
	case err == nil:
		r.observe(e, OutcomeProcessed, 1, nil)
		r.settle(e, "ack")
		r.c.processed.Add(1)
	case r.ctx.Err() != nil:
		// Shutting down: the failure may be the cancellation itself. The
		// delivery stays unsettled and comes back to the next run.
		r.observe(e, OutcomeInterrupted, 0, nil)
	case failed:
		// Classified before ErrDuplicate is looked for: a handler's error
		// that wraps it is still the handler's failure.
		r.fail(e, n, herr, idem.Classify(herr))
	case errors.Is(err, idem.ErrSequenceGap):
		r.gap(e, n, err)
	case errors.Is(err, idem.ErrDuplicate):
		r.observe(e, OutcomeDuplicate, 1, nil)
		if e.failed {
			// A copy of the message was applied while this one waited for
			// its retry: its recorded attempts are of no more use.
			if err := r.cfg.Ledger.ForgetAttempts(r.ctx, r.cfg.Name, e.dedup); err != nil {
				r.log(e).LogAttrs(r.ctx, slog.LevelDebug, "forgetting the attempts of a duplicate failed", slog.String("error", err.Error()))
			}
		}
		r.settle(e, "ack")
		r.c.duplicates.Add(1)
	default:
		// The inbox or the ledger failed, not the handler: whatever the
		// error says, another attempt may succeed.
		r.fail(e, n, err, idem.ClassTransient)
	}
}

// process runs fn in the inbox's transaction, de-duplicating e by its
// dedup key, or by its aggregate and sequence number.
func (r *runner) process(ctx context.Context, e *entry, fn func(ctx context.Context) error) error {
	if r.seqInbox != nil {
		return r.seqInbox.ProcessSequence(ctx, r.cfg.Name, e.aggregate, e.seq, r.cfg.Gap, fn)
	}
	return r.cfg.Inbox.Process(ctx, r.cfg.Name, e.dedup, fn)
}

// gap handles a message that met a gap in its aggregate's sequence under
// GapHold: it is retried, as a transient failure, until the gap closes.
// Under the Park policy, a gap below a message whose key is held back is
// the dead letter's own (it will not close until that is re-driven): the
// message is parked behind it, as the key's later messages are.
func (r *runner) gap(e *entry, n int, err error) {
	if e.ordered && r.cfg.AfterDeadLetter == Park {
		_, held, herr := r.cfg.Ledger.HeldBack(r.ctx, r.cfg.Name, e.msg.Key)
		if herr == nil && held {
			r.park(e, n)
			return
		}
	}
	r.fail(e, n, err, idem.ClassTransient)
}

// call runs the handler, turning a panic into a transient error.
func (r *runner) call(ctx context.Context, e *entry) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log(e).LogAttrs(ctx, slog.LevelError, "handler panicked",
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("%w: %v", ErrPanic, p)
		}
	}()
	return r.h.one(ctx, e.msg)
}

// park keeps a message whose key is held back behind a dead letter, unless
// its delivery is no longer the consumer's own (letGo).
func (r *runner) park(e *entry, n int) {
	if r.ctx.Err() == nil && r.stale(e) {
		r.letGo(e, "parked", true)
		return
	}
	parked := false
	err := r.cfg.InTx(r.ctx, func(ctx context.Context) error {
		// Asked again, in the transaction that parks, because the key may
		// have been let go since the inbox's transaction looked.
		_, h, err := r.cfg.Ledger.HeldBack(ctx, r.cfg.Name, e.msg.Key)
		if err != nil || !h {
			return err
		}
		if err := r.cfg.Ledger.Park(ctx, r.cfg.Name, e.msg); err != nil {
			return err
		}
		parked = true
		return nil
	})
	switch {
	case r.ctx.Err() != nil:
		r.observe(e, OutcomeInterrupted, 0, nil)
	case err != nil:
		r.fail(e, n, fmt.Errorf("park behind the key's dead letter: %w", err), idem.ClassTransient)
	case !parked:
		r.observe(e, OutcomeInterrupted, 0, nil)
		r.requeue(e)
	default:
		r.observe(e, OutcomeParked, 0, nil)
		r.log(e).LogAttrs(r.ctx, slog.LevelInfo, "message parked behind its key's dead letter")
		r.settle(e, "ack")
		r.c.parked.Add(1)
	}
}

// stale reports whether e's delivery is no longer the consumer's own: the
// transport answers InProgress with an error that matches
// idem.ErrStaleDelivery (its AckWait or lease ended and the message went
// to another holder, its Kafka partition was taken away, it was settled).
// Any other answer, a failing transport's included, leaves it the
// consumer's: nothing says otherwise.
func (r *runner) stale(e *entry) bool {
	err := e.d.InProgress(r.ctx)
	if err == nil {
		r.mu.Lock()
		e.beatAt = r.cfg.Clock.Now()
		r.mu.Unlock()
		return false
	}
	return errors.Is(err, idem.ErrStaleDelivery)
}

// letGo takes e, whose delivery is stale, out of memory without settling
// it, instead of what (a retry, a dead letter, parking) was due: the
// message's new holder applies it (the inbox absorbs a copy applied twice),
// and a dead letter or a hold on its key written from here would
// contradict that holder, even park the copy it applies.
//
// The new holder may be this consumer: a transport that delivered the
// message again to the same stream (JetStream, after its AckWait) has put
// the later delivery in the consumer's hands, behind the key's messages
// that came in between. That delivery then takes e's place at the head of
// the key, so that those messages do not overtake it.
//
// Otherwise the later messages of its key that the consumer holds go with
// it, handed back (Nack, no delay): applied here they would overtake the
// message, whose next delivery comes after them. So do, after them, those
// that the reader has taken from the transport but not yet put behind it
// (admit, handBack). The transport delivers
// them again behind it (a Kafka partition moves as a whole, so theirs are
// stale too; a database queue hands out the oldest due message first;
// JetStream delivers again in the order of the NAKs, so they are sent in
// the order of the messages: a later delivery of a message goes back in
// the place of its first).
//
// excuse says e is let go unattempted, or with every failed attempt
// recorded in the Ledger (a superseded head, from work or gather): its
// lapse was the consumer's own slowness, so the later delivery that takes
// its place carries e's excused lapses and e's own (entry.excused), which
// count neither towards MaxDeliveries nor towards the attempt number. So
// is a delivery let go instead of being parked: its key is held back, so
// its handler never ran. A delivery let go instead of being retried or
// dead-lettered was attempted, and that failure goes unrecorded: its lapse
// counts, as a crash does, or a handler that outlasts the AckWait every
// time would be run again and again, never dead-lettered (fail keeps the
// attempt's number in entry.last, which the later delivery numbers its
// own after). Only a later delivery held
// when e is let go is excused: one the reader was taking just then
// (letGoWhileTaking, admit) follows a head let go from fail or park, never
// a superseded one, which has its later delivery behind it.
func (r *runner) letGo(e *entry, what string, excuse bool) {
	r.observe(e, OutcomeStale, 0, nil)
	r.log(e).LogAttrs(r.ctx, slog.LevelWarn, "delivery no longer this consumer's own (its ack wait or lease ended, or its partition was taken away); let go unsettled, not "+what+": its new holder applies it")
	var behind []*entry
	var gone *letGone
	r.mu.Lock()
	delete(r.held, e)
	if e.ordered {
		q := r.lanes[e.msg.Key]
		if len(q) == 0 || q[0] != e {
			r.mu.Unlock()
			panic("consumer: let go an entry that is not the head of its key")
		}
		q[0] = nil
		behind = q[1:]
		if i := slices.IndexFunc(behind, func(f *entry) bool { return sameMessage(e, f) }); i >= 0 {
			// Its later delivery, here: it takes e's place.
			next := behind[i]
			if excuse && next.d.Attempt() > e.d.Attempt() {
				// A redelivery, not a copy published again under the same
				// ID, which the transport counts on its own. One lapse,
				// e's, is excused, not the difference of the counts: a
				// delivery to another holder in between, which may have
				// crashed, still counts.
				next.excused = max(next.excused, e.excused+1)
			}
			// Attempts e made and failed to record still count.
			next.last = max(next.last, e.last)
			copy(behind[1:i+1], behind[:i])
			behind[0] = next
			r.lanes[e.msg.Key] = behind
			// Counted before its later delivery can be: nothing is handed
			// back.
			r.c.stale.Add(1)
			r.ready <- next
			r.mu.Unlock()
			<-r.slots
			return
		}
		delete(r.lanes, e.msg.Key)
		for _, f := range behind {
			delete(r.held, f)
		}
		if r.taking {
			// Deliveries of its key that the reader has taken and not yet
			// put behind it go back as well, after these (admit).
			gone = &letGone{head: e, handedBack: make(chan struct{})}
			if r.letGoWhileTaking == nil {
				r.letGoWhileTaking = make(map[string]*letGone)
			}
			r.letGoWhileTaking[e.msg.Key] = gone
		}
	}
	r.mu.Unlock()
	for _, f := range inFirstPlaces(e, behind) {
		d := f.d
		r.settleWith(f, d, "nack", func(ctx context.Context) error { return d.Nack(ctx, 0) })
	}
	// Counted once its key-mates are handed back, as every count of Stats
	// follows what the transport was told, and before their next
	// deliveries can be taken and counted. Those the reader took meanwhile
	// are handed back after (handBack): they were not in memory yet.
	r.c.stale.Add(1)
	if gone != nil {
		close(gone.handedBack)
	}
	// The places are given back only now: the reader, taking deliveries
	// again, must find the key's messages back with the transport, not
	// take a later one of the key before them.
	for range 1 + len(behind) {
		<-r.slots
	}
}

// message names the message e is a delivery of: its message ID and its
// dedup key. ok is false when e's dedup key could not be derived: nothing
// then tells its message from the key's others. A blank message ID (its
// publisher set none) is named by its dedup key alone, read from the
// payload (Config.DedupKey), which is what the inbox tells it apart by.
func (e *entry) message() (m messageName, ok bool) {
	if e.dedupErr != nil || e.dedup == "" {
		return messageName{}, false
	}
	return messageName{e.msg.ID, e.dedup}, true
}

// messageName is what tells the deliveries of one message from those of
// another (entry.message).
type messageName struct{ id, dedup string }

// sameMessage reports whether f is a delivery of e's message: the one rule
// by which a stale head's later delivery is recognised, and by which
// inFirstPlaces groups the deliveries of a message.
func sameMessage(e, f *entry) bool {
	m, ok := e.message()
	n, fok := f.message()
	return ok && fok && m == n
}

// inFirstPlaces orders behind, the entries held behind head in its key,
// for handing back: each in the place of the first entry of its message
// (sameMessage), head's included, so that a later delivery of a message
// (its AckWait ended) goes back before the messages that came between its
// deliveries. The sort is stable: the deliveries of one message keep their
// order, and an entry whose message cannot be named keeps its own place.
func inFirstPlaces(head *entry, behind []*entry) []*entry {
	first := make(map[messageName]int, len(behind)+1)
	place := make(map[*entry]int, len(behind))
	for i, f := range append([]*entry{head}, behind...) {
		place[f] = i
		m, ok := f.message()
		if !ok {
			continue
		}
		if p, ok := first[m]; ok {
			place[f] = p
		} else {
			first[m] = i
		}
	}
	out := slices.Clone(behind)
	slices.SortStableFunc(out, func(a, b *entry) int { return place[a] - place[b] })
	return out
}

// fail handles a failed attempt: dead letter, or a retry. A delivery that
// is no longer the consumer's own is let go instead of dead-lettered
// (letGo).
func (r *runner) fail(e *entry, n int, cause error, class idem.ErrorClass) {
	maxAttempts := r.cfg.Retry.Attempts()
	if e.dedupErr == nil {
		// The ledger may know of attempts the transport's count missed.
		prior, err := r.cfg.Ledger.Attempts(r.ctx, r.cfg.Name, e.dedup)
		if err == nil {
			n = max(n, nextNumber(prior))
		}
	}
	dead := class == idem.ClassPermanent || n >= maxAttempts
	// Asked only where the answer changes what happens: before a dead
	// letter, and before a retry handed back to the transport (a message
	// without a key), whose Nack would count for nothing and whose attempt
	// recorded here would count against the message's new holder. A keyed
	// message retried in memory is not let go: its key's later messages,
	// which the consumer may hold and which may still be its own, would
	// then overtake its next delivery; its retry runs here instead, and the
	// inbox absorbs it should the new holder have applied it.
	if (dead || !e.ordered) && r.ctx.Err() == nil && r.stale(e) {
		what := "retried"
		if dead {
			what = "dead-lettered"
		}
		// Attempt n was made and failed, unrecorded: the later delivery
		// that takes e's place numbers its attempt after it.
		e.last = max(e.last, n)
		r.letGo(e, what, false)
		return
	}
	a := idem.Attempt{Number: n, At: r.cfg.Clock.Now(), Class: class, Error: cause.Error()}
	log := r.log(e).With(slog.Int("attempt", n), slog.String("class", string(class)), slog.String("error", a.Error))

	if dead {
		dlClass := idem.DeadPermanent
		if class != idem.ClassPermanent {
			dlClass = idem.DeadExhausted
		}
		id, err := r.deadLetter(e, dlClass, a)
		if err == nil {
			r.observe(e, OutcomeDeadLettered, 0, cause)
			log.LogAttrs(r.ctx, slog.LevelError, "message dead-lettered",
				slog.String("dead_letter", id), slog.String("dead_class", string(dlClass)))
			r.settle(e, "term")
			r.c.deadLettered.Add(1)
			return
		}
		if r.ctx.Err() != nil {
			r.observe(e, OutcomeInterrupted, 0, nil)
			return
		}
		// Nothing is lost: the message stays in the flow and the next
		// attempt tries the dead letters again.
		log.LogAttrs(r.ctx, slog.LevelError, "dead-lettering failed; retrying the message", slog.String("dl_error", err.Error()))
	} else if r.ctx.Err() == nil {
		if _, err := r.cfg.Ledger.RecordAttempt(r.ctx, r.cfg.Name, e.dedup, a); err != nil {
			log.LogAttrs(r.ctx, slog.LevelWarn, "recording the attempt failed", slog.String("ledger_error", err.Error()))
		} else {
			e.failed = true
		}
	}
	if r.ctx.Err() != nil {
		r.observe(e, OutcomeInterrupted, 0, nil)
		return
	}
	e.last = n
	delay, ok := idem.RetryDelay(cause)
	if !ok {
		delay = r.cfg.Retry.Delay(n, e.prevDelay)
	}
	delay = max(delay, 0)
	e.prevDelay = delay
	r.observe(e, OutcomeRetried, 0, cause)
	log.LogAttrs(r.ctx, slog.LevelWarn, "attempt failed; retrying", slog.Duration("delay", delay))
	r.retry(e, delay, errors.Is(cause, idem.ErrSequenceGap))
	// Counted once the retry is scheduled (the transport has its Nack, or
	// the consumer its timer): whoever reads Retried and then moves the
	// clock finds the retry due from before it moved.
	r.c.retried.Add(1)
}

// deadLetter moves e to the dead letters, with every recorded attempt and
// a, holds its key back under the Park policy, and forgets its attempts, in
// one transaction where Config.InTx provides one.
func (r *runner) deadLetter(e *entry, class idem.DeadLetterClass, a idem.Attempt) (string, error) {
	var id string
	err := r.cfg.InTx(r.ctx, func(ctx context.Context) error {
		var attempts []idem.Attempt
		if e.dedupErr == nil {
			prior, err := r.cfg.Ledger.Attempts(ctx, r.cfg.Name, e.dedup)
			if err != nil {
				return fmt.Errorf("read recorded attempts: %w", err)
			}
			attempts = append(attempts, prior...)
		}
		attempts = append(attempts, a)
		var err error
		id, err = r.cfg.DeadLetters.Add(ctx, idem.DeadLetter{
			Consumer:      r.cfg.Name,
			Message:       e.msg,
			Class:         class,
			Attempts:      attempts,
			FirstFailedAt: attempts[0].At,
			LastFailedAt:  a.At,
		})
		if err != nil {
			return fmt.Errorf("add dead letter: %w", err)
		}
		if e.ordered && r.cfg.AfterDeadLetter == Park {
			if err := r.cfg.Ledger.HoldBack(ctx, r.cfg.Name, e.msg.Key, id); err != nil {
				return fmt.Errorf("hold the key back: %w", err)
			}
		}
		if e.dedupErr == nil {
			if err := r.cfg.Ledger.ForgetAttempts(ctx, r.cfg.Name, e.dedup); err != nil {
				return fmt.Errorf("forget recorded attempts: %w", err)
			}
		}
		return nil
	})
	return id, err
}

// retry schedules e's next attempt after delay. A message without a key is
// handed back to the transport (Nack), which frees its place in memory. A
// message with a key waits inside the consumer, keeping its place at the
// head of its key: were it handed back, later messages of the key could
// arrive before it returned, and either overtake it or fill the memory
// while waiting for a delivery that then could not be taken.
//
// A message that met a gap in its aggregate's sequence (gap) is handed
// back even when it has a key: the messages that close the gap may be
// queued behind it, and must overtake it; its sequence number, not its
// place in the queue, orders it, and the inbox refuses it until they have
// been applied.
func (r *runner) retry(e *entry, delay time.Duration, gap bool) {
	if !e.ordered || gap {
		d := r.done(e)
		r.settleWith(e, d, "nack", func(ctx context.Context) error { return d.Nack(ctx, delay) })
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	e.waiting = true
	e.stop = r.cfg.Timers.AfterFunc(delay, func() { r.wake(e) })
}

// wake makes a waiting entry ready for its retry.
func (r *runner) wake(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || !e.waiting {
		return
	}
	e.waiting, e.stop = false, nil
	r.ready <- e
}

// requeue makes e ready again at once.
func (r *runner) requeue(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.ready <- e
	}
}

// settle takes e out of memory and acknowledges ("ack") or terminates
// ("term") its delivery.
func (r *runner) settle(e *entry, what string) {
	d := r.done(e)
	fn := d.Ack
	if what == "term" {
		fn = d.Term
	}
	r.settleWith(e, d, what, fn)
}

// settleWith settles d with fn. A failure is logged and otherwise ignored:
// the transport delivers the message again, and the inbox absorbs it.
func (r *runner) settleWith(e *entry, d idem.Delivery, what string, fn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), settleTimeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		r.log(e).LogAttrs(ctx, slog.LevelWarn, what+" failed; the message will be delivered again", slog.String("settle_error", err.Error()))
	}
}

func (r *runner) log(e *entry) *slog.Logger {
	return r.c.log.With(slog.String("message_id", e.msg.ID), slog.String("key", e.msg.Key))
}

// nextNumber is the number of the attempt that follows those recorded.
func nextNumber(prior []idem.Attempt) int {
	n := len(prior)
	if len(prior) > 0 {
		n = max(n, prior[len(prior)-1].Number)
	}
	return n + 1
}
