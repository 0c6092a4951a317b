package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/idem-go/idem"
)

// BatchHandler applies many messages at once, inside the inbox's
// transaction, which ctx carries: for effects that can be written in bulk,
// such as one UPDATE … FROM (VALUES …) for a whole batch. msgs are the
// messages of the batch that the inbox had not processed yet, in the order
// they were delivered (so a key's messages come in their key's order);
// BatchInfoFromContext returns their Info, index for index.
//
// Return nil when every message is applied. An error fails the whole
// batch: nothing of it is committed, and the consumer then handles its
// messages one at a time (each a batch of one) to find the one that fails,
// unless the error is an *ItemError, which names it: the others are then
// applied again, at once, in a batch without it. Errors are classified as
// a Handler's are (idem.Permanent, idem.RetryAfter), and a panic is a
// transient failure of the whole batch.
type BatchHandler func(ctx context.Context, msgs []idem.Message) error

// ItemError is the error a BatchHandler returns when it knows which message
// of the batch failed: msgs[Index], with Err (classified as a Handler's
// error is).
type ItemError struct {
	Index int
	Err   error
}

func (e *ItemError) Error() string { return fmt.Sprintf("message %d of the batch: %v", e.Index, e.Err) }
func (e *ItemError) Unwrap() error { return e.Err }

type batchInfoKey struct{}

// BatchInfoFromContext returns the Info of the messages a BatchHandler is
// applying, index for index, when ctx is (derived from) its context.
func BatchInfoFromContext(ctx context.Context) ([]Info, bool) {
	i, ok := ctx.Value(batchInfoKey{}).([]Info)
	return i, ok
}

// handlers are what Run or RunBatch was given: one applies a message; many,
// when set, applies a batch.
type handlers struct {
	one  Handler
	many BatchHandler
}

// gather makes a batch from first, a ready entry: the entries queued behind
// it in its lane, then more ready entries and theirs, up to BatchSize, or
// until BatchWait has passed. A batch never holds two entries with one
// dedup key, nor an entry whose key could not be derived: those are made
// ready again once the batch is gathered, for a later batch. A ready entry
// that a later delivery of its message supersedes (superseded) is let go
// instead, as work does.
func (r *runner) gather(first *entry) []*entry {
	limit := r.cfg.BatchSize
	batch := make([]*entry, 0, min(limit, 16))
	keys := make(map[string]struct{}, cap(batch))
	var later []*entry
	fits := func(e *entry) bool {
		if e.dedupErr != nil || r.overDelivered(e) {
			return false
		}
		_, dup := keys[e.dedup]
		return !dup
	}
	take := func(e *entry) {
		if r.superseded(e) {
			// As in work: its later delivery takes its place, ready.
			r.begin(e)
			r.letGo(e, "handled", true)
			return
		}
		if !fits(e) {
			later = append(later, e)
			return
		}
		batch = append(batch, e)
		keys[e.dedup] = struct{}{}
		if !e.ordered {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		// The lane's later entries join behind their head, in order, up
		// to the first that cannot: one that does not fit, or a stale one
		// that a later delivery of its message supersedes, which is let go
		// once it comes to its key's head (work and take), as it would be
		// taken alone.
		lane := r.lanes[e.msg.Key]
		for i, f := range lane[1:] {
			if len(batch) >= limit || !fits(f) || supersededBy(f, lane[i+2:]) {
				break
			}
			batch = append(batch, f)
			keys[f.dedup] = struct{}{}
		}
	}
	take(first)
	var deadline chan struct{}
	stop := func() bool { return false }
	for len(batch) < limit {
		select {
		case e := <-r.ready:
			take(e)
			continue
		default:
		}
		if r.cfg.BatchWait <= 0 {
			break
		}
		if deadline == nil {
			deadline = make(chan struct{})
			stop = r.cfg.Timers.AfterFunc(r.cfg.BatchWait, func() { close(deadline) })
		}
		select {
		case e := <-r.ready:
			take(e)
			continue
		case <-deadline:
		case <-r.ctx.Done():
		}
		break
	}
	stop()
	if len(later) > 0 {
		r.mu.Lock()
		for _, e := range later {
			if !r.closed {
				r.ready <- e
			}
		}
		r.mu.Unlock()
	}
	return batch
}

// errBatchHeld rolls back a batch in which a key turned out to be held
// back: its messages are parked instead, and must leave no inbox row.
var errBatchHeld = errors.New("consumer: a key of the batch is held back")

// handleBatch applies a batch in as few inbox transactions as it takes, and
// settles it. A message that fails, or whose key is held back, is taken out
// (with the entries of its key behind it) and dealt with on its own, and the
// rest is tried again as a batch. The lanes learn of the committed entries
// only at the end, since the entries behind them in the batch belong to the
// batch until then.
func (r *runner) handleBatch(batch []*entry) {
	var applied []*entry // committed, in commit order
	var unacked []*entry // committed and not acknowledged in the transaction
	var later []failure  // failed behind their lane's head, in the batch
	var done settled     // counts of the committed entries
	singles := false     // a BatchHandler failed without saying which message
	for _, e := range batch {
		r.begin(e)
	}
	for len(batch) > 0 && r.ctx.Err() == nil {
		part := batch
		if singles {
			part = batch[:1]
		}
		res := r.attempt(part)
		if res.err == nil {
			applied = append(applied, part...)
			done.processed += res.processed
			done.duplicates += res.duplicates
			if !res.acked {
				unacked = append(unacked, part...)
			}
			batch = batch[len(part):]
			continue
		}
		switch {
		case r.ctx.Err() != nil:
			// Shutting down: the failure may be the cancellation itself;
			// what is left stays unsettled and comes back to the next run.
			r.interrupted(batch)
			batch = nil
		case len(res.held) > 0:
			var parked []*entry
			batch, parked = r.split(batch, nil, func(e *entry) bool {
				_, held := res.held[e.msg.Key]
				return e.ordered && held
			})
			later = r.forget(later, parked)
			for _, e := range parked {
				r.park(e, r.number(e))
			}
		case res.failed != nil:
			var failed []*entry
			e := res.failed
			batch, failed = r.split(batch, e, func(f *entry) bool { return f == e })
			if len(failed) > 0 {
				later = r.forget(later, failed)
				r.fail(e, r.number(e), res.err, idem.Classify(res.err))
			} else {
				// Behind its lane's head, which may commit in this batch:
				// the failure is dealt with once the head has settled.
				later = append(later, failure{e, r.number(e), res.err})
			}
		case res.whole && !singles && len(part) > 1:
			singles = true
		default:
			// The inbox, the ledger or the commit failed, not a handler:
			// whatever the error says, another attempt may succeed, for
			// every message of the batch.
			_, failed := r.split(batch, nil, func(*entry) bool { return true })
			later = r.forget(later, failed)
			for _, e := range failed {
				r.fail(e, r.number(e), res.err, idem.ClassTransient)
			}
			batch = nil
		}
	}
	r.interrupted(batch) // left when Run stopped
	r.settleBatch(applied, unacked, later, done)
}

// forget drops from later the failures of the keys of heads, which are
// about to be dealt with on their own: once one of them settles (a dead
// letter, parked, let go), the next entry of its key goes to whichever
// worker is free, and its failure in this batch must not be dealt with
// here as well. It is tried again when its turn comes, as the failure of
// an entry whose head did not settle in the batch is.
func (r *runner) forget(later []failure, heads []*entry) []failure {
	keys := make(map[string]struct{}, len(heads))
	for _, e := range heads {
		if e.ordered {
			keys[e.msg.Key] = struct{}{}
		}
	}
	// An entry in later is behind its lane's head, so it has a key.
	return slices.DeleteFunc(later, func(f failure) bool {
		if _, ok := keys[f.e.msg.Key]; !ok {
			return false
		}
		r.observe(f.e, OutcomeInterrupted, 0, nil)
		return true
	})
}

// settled counts a batch's committed entries, for Stats once they are
// acknowledged.
type settled struct{ processed, duplicates int64 }

// failure is a failed attempt whose handling waits for the batch to
// settle.
type failure struct {
	e   *entry
	n   int
	err error
}

// batchResult is how one attempt at a batch went.
type batchResult struct {
	err error
	// acked is set when the acknowledgements committed with the batch.
	acked bool
	// processed and duplicates count the batch's messages that committed
	// fresh and those the inbox had processed already.
	processed, duplicates int64
	// held holds the keys found held back (the batch rolled back).
	held map[string]string
	// failed is the entry whose handler failed with err; whole is set when
	// a BatchHandler failed without naming a message.
	failed *entry
	whole  bool
}

// attempt runs one inbox transaction for the batch: the keys' holds, the
// handlers of the messages not processed yet, the forgetting of recorded
// attempts, and, where the transport joins the transaction, the
// acknowledgements.
func (r *runner) attempt(batch []*entry) (res batchResult) {
	keys := make([]string, len(batch))
	infos := make([]Info, len(batch))
	for i, e := range batch {
		keys[i] = e.dedup
		infos[i] = Info{Consumer: r.cfg.Name, DedupKey: e.dedup, Attempt: r.number(e)}
	}
	park := r.cfg.AfterDeadLetter == Park
	var fresh []bool
	bctx := r.ctx
	if len(batch) == 1 && batch[0].obs.ctx != nil {
		bctx = batch[0].obs.ctx // a batch of one is handled in its message's context
	}
	res.err = r.batchInbox.ProcessBatch(bctx, r.cfg.Name, keys, func(ctx context.Context, isFresh []bool) error {
		res = batchResult{}
		fresh = isFresh
		if park {
			held, err := r.heldBack(ctx, batch)
			if err != nil {
				return fmt.Errorf("check whether the keys are held back: %w", err)
			}
			if len(held) > 0 {
				res.held = held
				return errBatchHeld
			}
		}
		if err := r.apply(ctx, batch, fresh, infos, &res); err != nil {
			return err
		}
		for i, e := range batch {
			if fresh[i] && (e.failed || e.d.Attempt() > 1) {
				if err := r.cfg.Ledger.ForgetAttempts(ctx, r.cfg.Name, e.dedup); err != nil {
					return fmt.Errorf("forget recorded attempts: %w", err)
				}
			}
		}
		if r.batchStream != nil && r.batchStream.AcksInTx(ctx) {
			ds := make([]idem.Delivery, len(batch))
			for i, e := range batch {
				ds[i] = e.d
			}
			n, err := r.batchStream.AckBatch(ctx, ds)
			if err != nil {
				return fmt.Errorf("acknowledge the batch: %w", err)
			}
			if n < len(ds) {
				r.c.log.LogAttrs(ctx, slog.LevelDebug, "deliveries of the batch were handed out again before their acknowledgement",
					slog.Int("stale", len(ds)-n))
			}
			res.acked = true
		}
		return nil
	})
	if res.err == nil {
		for i, e := range batch {
			if fresh[i] {
				res.processed++
				r.observe(e, OutcomeProcessed, len(batch), nil)
			} else {
				res.duplicates++
				r.observe(e, OutcomeDuplicate, len(batch), nil)
				if e.failed {
					// A copy of the message was applied while this one
					// waited for its retry: its recorded attempts are of
					// no more use.
					if err := r.cfg.Ledger.ForgetAttempts(r.ctx, r.cfg.Name, e.dedup); err != nil {
						r.log(e).LogAttrs(r.ctx, slog.LevelDebug, "forgetting the attempts of a duplicate failed", slog.String("error", err.Error()))
					}
				}
			}
		}
	}
	return res
}

// apply runs the handlers of the batch's fresh messages in the inbox's
// transaction, and notes in res which failed.
func (r *runner) apply(ctx context.Context, batch []*entry, fresh []bool, infos []Info, res *batchResult) error {
	if r.h.many == nil {
		for i, e := range batch {
			if !fresh[i] {
				continue
			}
			if err := r.call(context.WithValue(ctx, infoKey{}, infos[i]), e); err != nil {
				res.failed = e
				return err
			}
		}
		return nil
	}
	var msgs []idem.Message
	var of []int // index in batch of each of msgs
	var fi []Info
	for i, e := range batch {
		if fresh[i] {
			msgs = append(msgs, e.msg)
			of = append(of, i)
			fi = append(fi, infos[i])
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	err := r.callBatch(context.WithValue(ctx, batchInfoKey{}, fi), msgs)
	if err == nil {
		return nil
	}
	var ie *ItemError
	if errors.As(err, &ie) && ie.Index >= 0 && ie.Index < len(msgs) {
		res.failed = batch[of[ie.Index]]
		return ie.Err
	}
	if len(msgs) == 1 {
		res.failed = batch[of[0]]
		return err
	}
	res.whole = true
	return err
}

// callBatch runs the BatchHandler, turning a panic into a transient error.
func (r *runner) callBatch(ctx context.Context, msgs []idem.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.c.log.LogAttrs(ctx, slog.LevelError, "batch handler panicked", slog.Int("messages", len(msgs)), slog.Any("panic", p))
			err = fmt.Errorf("%w: %v", ErrPanic, p)
		}
	}()
	return r.h.many(ctx, msgs)
}

// heldBack returns which keys of the batch's ordered messages are held
// back, looked up in the transaction ctx carries.
func (r *runner) heldBack(ctx context.Context, batch []*entry) (map[string]string, error) {
	var keys []string
	seen := make(map[string]struct{})
	for _, e := range batch {
		if _, ok := seen[e.msg.Key]; e.ordered && !ok {
			seen[e.msg.Key] = struct{}{}
			keys = append(keys, e.msg.Key)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if r.batchLedger != nil {
		return r.batchLedger.HeldBackKeys(ctx, r.cfg.Name, keys)
	}
	var held map[string]string
	for _, k := range keys {
		id, h, err := r.cfg.Ledger.HeldBack(ctx, r.cfg.Name, k)
		if err != nil {
			return nil, err
		}
		if h {
			if held == nil {
				held = make(map[string]string)
			}
			held[k] = id
		}
	}
	return held, nil
}

// without splits batch into the entries to keep and those out selects that
// may be dealt with on their own now: the heads of their lanes (and
// messages without a key). An entry out selects behind its lane's head
// cannot be: it is only dropped from the batch, and handled once it is the
// head. Every entry of a key behind one taken out is dropped too, so that
// it cannot overtake it.
func (r *runner) without(batch []*entry, out func(*entry) bool) (keep, taken []*entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stopped := make(map[string]struct{})
	for _, e := range batch {
		if e.ordered {
			if _, ok := stopped[e.msg.Key]; ok {
				continue
			}
		}
		if !out(e) {
			keep = append(keep, e)
			continue
		}
		if e.ordered {
			stopped[e.msg.Key] = struct{}{}
			if q := r.lanes[e.msg.Key]; len(q) == 0 || q[0] != e {
				continue
			}
		}
		taken = append(taken, e)
	}
	return keep, taken
}

// number is the number of e's next attempt, from the transport's count less
// the lapses excused (delivered) and the attempts of this process; a
// redelivery's recorded attempts are read once from the ledger.
func (r *runner) number(e *entry) int {
	n := max(r.delivered(e), e.last+1, 1)
	if !e.loaded && e.d.Attempt() > 1 {
		// A redelivery: earlier attempts, perhaps by an earlier run of the
		// consumer, may be in the ledger.
		e.loaded = true
		prior, err := r.cfg.Ledger.Attempts(r.ctx, r.cfg.Name, e.dedup)
		if err != nil {
			r.log(e).LogAttrs(r.ctx, slog.LevelWarn, "reading recorded attempts failed", slog.String("error", err.Error()))
		} else if len(prior) > 0 {
			e.failed = true
			e.last = max(e.last, nextNumber(prior)-1)
			n = max(n, nextNumber(prior))
		}
	}
	return n
}

// settleBatch takes the committed entries out of memory, in order, lets the
// next entries of their keys go, acknowledges those whose acknowledgement
// did not commit with them, counts them in Stats, and deals with the
// failures left for later.
func (r *runner) settleBatch(applied, unacked []*entry, later []failure, done settled) {
	if len(applied) > 0 {
		r.release(applied, later)
		r.ack(unacked)
		r.c.processed.Add(done.processed)
		r.c.duplicates.Add(done.duplicates)
	}
	// Each failure behind a head is dealt with now if the head settled, so
	// that it is the head of its lane; otherwise it is dropped, unrecorded,
	// and its message is tried again when its turn comes.
	for _, f := range later {
		if r.isHead(f.e) {
			r.fail(f.e, f.n, f.err, idem.Classify(f.err))
		} else {
			r.observe(f.e, OutcomeInterrupted, 0, nil)
		}
	}
}

// isHead reports whether e is the head of its lane.
func (r *runner) isHead(e *entry) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.lanes[e.msg.Key]
	return len(q) > 0 && q[0] == e
}

// release takes the committed entries out of memory, in order, and makes
// the next entries of their keys ready, except those whose failure is to be
// dealt with once they are heads.
func (r *runner) release(applied []*entry, later []failure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	touched := make(map[string]struct{})
	for _, e := range applied {
		delete(r.held, e)
		if e.ordered {
			q := r.lanes[e.msg.Key]
			if len(q) == 0 || q[0] != e {
				panic("consumer: settled a batch entry that is not the head of its key")
			}
			q[0] = nil
			r.lanes[e.msg.Key] = q[1:]
			touched[e.msg.Key] = struct{}{}
		}
		<-r.slots
	}
	waiting := make(map[*entry]bool, len(later))
	for _, f := range later {
		waiting[f.e] = true
	}
	for k := range touched {
		if q := r.lanes[k]; len(q) == 0 {
			delete(r.lanes, k)
		} else if !waiting[q[0]] {
			r.ready <- q[0]
		}
	}
}

// ack acknowledges the deliveries of entries whose acknowledgement did not
// commit with them: in one call when the stream takes batches.
func (r *runner) ack(unacked []*entry) {
	if len(unacked) == 0 {
		return
	}
	if r.batchStream == nil {
		for _, e := range unacked {
			r.settleWith(e, e.d, "ack", e.d.Ack)
		}
		return
	}
	ds := make([]idem.Delivery, len(unacked))
	for i, e := range unacked {
		ds[i] = e.d
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), settleTimeout)
	defer cancel()
	n, err := r.batchStream.AckBatch(ctx, ds)
	switch {
	case err != nil:
		r.c.log.LogAttrs(ctx, slog.LevelWarn, "ack failed; the messages will be delivered again",
			slog.Int("messages", len(ds)), slog.String("settle_error", err.Error()))
	case n < len(ds):
		r.c.log.LogAttrs(ctx, slog.LevelDebug, "deliveries were handed out again before their acknowledgement",
			slog.Int("stale", len(ds)-n))
	}
}
