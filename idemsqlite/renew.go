package idemsqlite

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/idem-go/idem"
)

// A renewal never waits for the writer's turn to be handed over: a
// transaction may hold the writer as long as its handler runs (CompleteTx
// after its first write), and a renewal that waited for it, the holder's
// own among them, would time out and its execution be cancelled for a lease
// that nobody could take over meanwhile. So a renewal asked for while the
// writer is held is queued here, its lease counted from when it was asked
// for, and:
//
//   - every claim decides on a key as if its queued renewals were written
//     (pendingLeaseEnd), so none takes over a key whose renewal was asked
//     for before its lease ended;
//   - the turn's holder writes the queued renewals whenever it hands the
//     writer over (writerQueue.release), into the open group when the next
//     in line joins it, or in a transaction of their own, before the next
//     in line gets the writer;
//   - those written into a group that then fails are written again, in a
//     transaction of their own, before the writer is handed over, and a
//     write that fails leaves them queued (and honoured) for the next
//     hand-over.
//
// Renew returns a queued renewal at once, as made: it will be written
// before any claim in this process can read the time for its key.
type renewal struct {
	ref idem.Ref
	end int64 // the lease's new end, in Unix nanoseconds
	// done is closed, and err set, once the renewal was written (or
	// failed to be); told says so. Only the writer's turn holder sets
	// them.
	done chan struct{}
	err  error
	told bool
	// left says that Renew returned before the renewal was written.
	// Guarded by writerQueue.mu.
	left bool
}

// tell gives r's outcome to its waiter, the first time only.
func (r *renewal) tell(err error) {
	if !r.told {
		r.told = true
		r.err = err
		close(r.done)
	}
}

// queueRenewal queues r when the writer's turn is held, and reports
// whether it did; otherwise it takes the turn for the caller, who writes
// r and releases it. now is read under the queue's lock, so that a claim
// that reads the time after it sees r queued (see pendingLeaseEnd).
func (q *writerQueue) queueRenewal(ref idem.Ref, lease time.Duration, now func() time.Time) (r *renewal, queued bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r = &renewal{ref: ref, end: now().Add(lease).UnixNano(), done: make(chan struct{})}
	if !q.held {
		q.held, q.heldAt = true, time.Now()
		return r, false
	}
	// An earlier renewal of the same lease whose waiter left is replaced:
	// this one, asked for later, is the lease its holder wants now, which
	// may end sooner than the earlier one (a Renew with a shorter lease).
	// Written in turn, the two would leave this one's end anyway, the one
	// claims honour meanwhile (pendingLeaseEnd takes the last asked for):
	// replaced, the earlier one costs no write.
	kept := q.renewals[:0]
	for _, p := range q.renewals {
		if !(p.left && p.ref == ref) {
			kept = append(kept, p)
		}
	}
	clear(q.renewals[len(kept):])
	q.renewals = append(kept, r)
	return r, true
}

// leave marks r's waiter gone: a later renewal of its lease replaces it.
func (q *writerQueue) leave(r *renewal) {
	q.mu.Lock()
	r.left = true
	q.mu.Unlock()
}

// pendingLeaseEnd returns the lease end that the queued renewals of the
// lease of scope and key under token leave once written, or 0 when none
// is queued: the last one asked for, written last, whose end replaces the
// others' (see Store.Renew), even when it is sooner. Only the writer's turn
// holder may rely on it (nobody else writes queued renewals); a claim
// answered from the read pool takes it as a hint that may come late (a
// renewal written since its read is no longer queued), and only answers.
func (q *writerQueue) pendingLeaseEnd(ref idem.Ref) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range slices.Backward(q.renewals) {
		if r.ref == ref {
			return r.end
		}
	}
	return 0
}

// dropRenewals forgets the queued renewals of ref: its lease is being
// yielded, and a renewal written after the yield would give the key a live
// lease again. The caller holds the writer's turn.
func (q *writerQueue) dropRenewals(ref idem.Ref) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.renewals[:0]
	for _, r := range q.renewals {
		if r.ref != ref {
			kept = append(kept, r)
		} else {
			r.tell(idem.ErrLeaseLost)
		}
	}
	clear(q.renewals[len(kept):])
	q.renewals = kept
}

// writeRenewals writes the queued renewals, by the writer's turn holder
// as it hands the turn over: into the open group, or in a transaction of
// their own when none is open. It reports false when that transaction
// failed: the renewals are queued again, and their waiters told.
func (q *writerQueue) writeRenewals() bool {
	q.mu.Lock()
	batch := q.renewals
	q.renewals = nil
	g := q.group
	q.mu.Unlock()
	if len(batch) == 0 {
		return true
	}
	bg := context.Background() // never interrupted: see writerQueue
	if g != nil {
		if g.failed != nil {
			// The group is about to be rolled back: the renewals are
			// written after it, on their own.
			q.requeue(batch)
			return true
		}
		r := q.db.in(g.tx)
		for _, rn := range batch {
			rn.tell(renewIn(bg, r, rn))
		}
		g.renewed = append(g.renewed, batch...)
		return true
	}
	tx, err := q.db.writer.BeginTx(bg, nil)
	if err == nil {
		results := make([]error, len(batch))
		r := q.db.in(tx)
		for i, rn := range batch {
			if results[i] = renewIn(bg, r, rn); results[i] != nil && !errors.Is(results[i], idem.ErrLeaseLost) {
				err = results[i]
				break
			}
		}
		if err == nil {
			if err = tx.Commit(); err == nil {
				for i, rn := range batch {
					rn.tell(results[i])
				}
				return true
			}
		} else {
			tx.Rollback()
		}
	}
	for _, rn := range batch {
		rn.tell(err)
	}
	q.requeue(batch)
	return false
}

// requeue puts batch back in front of the queued renewals.
func (q *writerQueue) requeue(batch []*renewal) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.renewals = append(batch, q.renewals...)
}

// renewIn writes rn with r, fenced by its token.
func renewIn(ctx context.Context, r runner, rn *renewal) error {
	res, err := r.exec(ctx, sqlRenewKey, rn.end, string(rn.ref.Scope), string(rn.ref.Key), int64(rn.ref.Token))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return idem.ErrLeaseLost
}
