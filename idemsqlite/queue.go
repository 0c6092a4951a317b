package idemsqlite

import (
	"context"
	"sync"
)

// writerQueue hands the single writer to the package's transactions in the
// order they asked for it.
//
// database/sql gives a connection that its pool frees to one of the waiting
// callers chosen at random. With one connection and n callers waiting, each
// is then served with probability 1/n per transaction, whatever it waited
// already: under a steady queue of 64, one caller in a hundred waits for
// about 290 transactions (64 · ln 100) before it gets the writer, where in
// order it would wait for 64. idem serve on SQLite under wrk -c64 showed it:
// a p99 of 340 to 380ms for transactions of about a millisecond. So every
// transaction the package begins on the writer first takes its turn here
// and holds it until it ends; the pool then has at most one of them waiting.
// Writes made through DB.Writer() directly do not queue here, and take the
// pool's turns as before.
//
// The order has a price for work that batches: an SQLite consumer alone,
// whose hand-outs, batches and acks follow each other in line rather than
// by chance, ran about a tenth slower (idem bench messages). Letting the
// package's background transactions skip the line gave it back, but the
// service's requests then lost turns to the relay and the settlement, and
// idem serve on SQLite made a quarter to a half fewer payments.
type writerQueue struct {
	mu      sync.Mutex
	held    bool
	waiting []chan struct{} // in order of arrival
}

// acquire waits for the writer's turn, until ctx ends.
func (q *writerQueue) acquire(ctx context.Context) error {
	q.mu.Lock()
	if !q.held {
		q.held = true
		q.mu.Unlock()
		return nil
	}
	turn := make(chan struct{})
	q.waiting = append(q.waiting, turn)
	q.mu.Unlock()
	select {
	case <-turn:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	for i, w := range q.waiting {
		if w == turn {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			q.mu.Unlock()
			return ctx.Err()
		}
	}
	q.mu.Unlock()
	// The turn came as ctx ended: it passes to the next.
	q.release()
	return ctx.Err()
}

// release passes the turn to the first caller waiting, or frees it.
func (q *writerQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 {
		q.held = false
		return
	}
	next := q.waiting[0]
	q.waiting[0] = nil
	q.waiting = q.waiting[1:]
	close(next)
}
