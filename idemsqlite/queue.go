package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"
)

// writerQueue hands the single writer to the package's transactions in the
// order they asked for it, and lets the synced ones that follow each other
// in line share one transaction, and so one commit (group commit).
//
// # Order
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
// # Group commit
//
// A synced commit waits for the disk (fsync), which takes longer than the
// statements of a typical transaction: on the machine where this was
// measured, about 300µs against some 80µs. So a synced transaction (WithTx,
// Store.ClaimTx, Store.CompleteTx and every transaction of the package
// that is not one of the unsynced ones) does not begin a transaction of
// its own: it runs in a savepoint of the group's transaction, and when it
// ends, the turn passes to the next in line with the transaction still
// open if that one is a synced transaction too, so that it joins. The last
// of the group, the one with nobody synced behind it (or the one ending
// when the group has been open Config.GroupCommit, or holds
// maxGroupMembers), commits for all; each member returns once that commit
// has, with its result. One fsync then serves the whole group (see the
// package documentation, "Group commit", for what it gains).
//
// What a member gives up: its commit waits for the members behind it in
// its group (a member that holds the writer long delays the commit of those
// before it too, not only of those after it); and a member shares the fate
// of its group: when the group's commit fails, or a member's statement is
// interrupted in the middle of a write (SQLite then rolls back the whole
// transaction; txState.stmtContext keeps a member's context from doing so
// but for a runaway statement), every member's writes are lost together
// and every member returns an error, none of them having been
// acknowledged. Every member returns only once its group has committed or
// failed, and a member that ran after others in its group may have read
// their writes before they committed, so whatever it returns, even an
// error of its own, is replaced by the group's error when the group fails:
// nothing a member returns rests on writes that never committed.
type writerQueue struct {
	// window is Config.GroupCommit: how long a group stays open for
	// members to join it; 0 or less: none joins (each commits alone).
	window time.Duration
	// db is the DB whose writer the queue hands out, which writes the
	// queued renewals.
	db *DB

	mu   sync.Mutex
	held bool
	// heldAt is when the turn's holder got it (see DB.WriterState).
	heldAt  time.Time
	waiting []*waiter // in order of arrival
	// group is the open shared transaction, or nil. Only the turn's
	// holder begins, joins or ends it.
	group *txGroup
	// renewals are the lease renewals asked for while the turn was held,
	// not yet written (see renewal).
	renewals []*renewal
}

// waiter is one caller waiting for the writer.
type waiter struct {
	turn chan struct{}
	// synced: the caller joins an open group (a synced transaction).
	synced bool
}

// maxGroupMembers bounds the transactions of one group, and so the size of
// the WAL frames one commit writes.
const maxGroupMembers = 256

// acquire waits for the writer's turn, until ctx ends. synced says that
// the caller is a synced transaction, which joins an open group.
func (q *writerQueue) acquire(ctx context.Context, synced bool) error {
	q.mu.Lock()
	if !q.held {
		q.held, q.heldAt = true, time.Now()
		q.mu.Unlock()
		return nil
	}
	w := &waiter{turn: make(chan struct{}), synced: synced}
	q.waiting = append(q.waiting, w)
	q.mu.Unlock()
	select {
	case <-w.turn:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	for i, x := range q.waiting {
		if x == w {
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

// release ends the turn: it commits the open group unless the first caller
// waiting joins it, then passes the turn to that caller, or frees it.
//
// Before it hands the turn over, it writes the renewals queued meanwhile
// (see renewal), and writes again on their own those written into a group
// that failed: renewals go ahead of whoever is next in line.
func (q *writerQueue) release() {
	for {
		written := q.writeRenewals()
		q.mu.Lock()
		if g := q.group; g != nil && !q.keepOpen(g) {
			q.group = nil
			q.mu.Unlock()
			g.end() // still holding the turn: nobody writes meanwhile
			if g.err != nil && len(g.renewed) > 0 {
				q.requeue(g.renewed)
			}
			q.mu.Lock()
		}
		// Renewals queued since, or to write again after a failed group,
		// are written before the turn passes; after a failed write of
		// their own, they stay queued (and honoured by claims) until the
		// next hand-over.
		if len(q.renewals) == 0 || !written {
			break
		}
		q.mu.Unlock()
	}
	defer q.mu.Unlock()
	if len(q.waiting) == 0 {
		q.held = false
		return
	}
	next := q.waiting[0]
	q.waiting[0] = nil
	q.waiting = q.waiting[1:]
	q.heldAt = time.Now()
	close(next.turn)
}

// groupOpen reports whether a group is open. Only the turn's holder may
// rely on the answer: nobody else begins or ends a group.
func (q *writerQueue) groupOpen() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.group != nil
}

// keepOpen reports whether g stays open for the first caller waiting.
// q.mu is held.
func (q *writerQueue) keepOpen(g *txGroup) bool {
	return g.failed == nil && q.window > 0 && len(q.waiting) > 0 && q.waiting[0].synced &&
		g.joined < maxGroupMembers && time.Since(g.started) < q.window
}

// join makes the turn's holder a member of the open group, beginning one
// if none is open. afterOthers reports that members joined the group
// before it. On an error the caller still holds the turn, and releases it.
func (q *writerQueue) join(writer *sql.DB) (g *txGroup, afterOthers bool, err error) {
	q.mu.Lock()
	g = q.group
	q.mu.Unlock()
	if g == nil {
		// The group's transaction outlives the context of whoever began
		// it: database/sql would roll it back when that context ended.
		tx, err := writer.BeginTx(context.Background(), nil)
		if err != nil {
			return nil, false, err
		}
		g = &txGroup{tx: tx, started: time.Now(), done: make(chan struct{})}
		q.mu.Lock()
		q.group = g
		q.mu.Unlock()
	}
	afterOthers = g.joined > 0
	g.joined++
	if _, err := g.tx.ExecContext(context.Background(), "SAVEPOINT idemsqlite_member"); err != nil {
		g.fail(err)
		return nil, false, err
	}
	return g, afterOthers, nil
}

// txGroup is a transaction that synced transactions share, each in a
// savepoint, and that commits once for all of them.
type txGroup struct {
	tx      *sql.Tx
	started time.Time
	// joined counts the members so far; failed is why the group cannot
	// commit. Only the turn's holder touches them.
	joined int
	failed error
	// renewed are the renewals written into the group: written again on
	// their own if it fails.
	renewed []*renewal
	// done is closed once the group has committed, or failed; err is
	// then the outcome, nil when it committed.
	done chan struct{}
	err  error
}

// leave ends the turn holder's membership: its savepoint is released into
// the group's transaction (commit), or rolled back. An error leaves the
// group unable to commit.
func (g *txGroup) leave(commit bool) error {
	bg := context.Background() // never interrupted: see writerQueue
	var err error
	if commit {
		_, err = g.tx.ExecContext(bg, "RELEASE idemsqlite_member")
	} else if _, err = g.tx.ExecContext(bg, "ROLLBACK TO idemsqlite_member"); err == nil {
		_, err = g.tx.ExecContext(bg, "RELEASE idemsqlite_member")
	}
	if err != nil {
		// The savepoint is gone when the whole transaction is: SQLite
		// rolls it back when a write is interrupted.
		err = fmt.Errorf("ending a transaction's savepoint in the group, which SQLite may have rolled back whole (as it does when a write is interrupted): %w", err)
		g.fail(err)
	}
	return err
}

func (g *txGroup) fail(err error) {
	if g.failed == nil {
		g.failed = fmt.Errorf("a transaction committed together with this one failed, so none of them committed: %w", err)
	}
}

// end commits the group, or rolls it back when it failed, and tells its
// members.
func (g *txGroup) end() {
	if g.failed != nil {
		g.tx.Rollback()
		g.err = g.failed
	} else {
		g.err = g.tx.Commit()
	}
	close(g.done)
}

// WriterState is a moment's view of the writer's turn (see DB.WriterState).
type WriterState struct {
	// Held is how long the transaction (or renewal) holding the writer's
	// turn has held it: from when the turn was handed to it, not from its
	// first statement. 0 when nobody holds it.
	Held time.Duration
	// Waiting counts the callers waiting for the turn.
	Waiting int
	// Renewals counts the lease renewals queued for the next hand-over.
	Renewals int
}

// WriterState tells how long the writer's turn has been held, and how many
// wait for it: a watchdog's reading. Every write transaction of the DB
// takes the turn in turn (see Config.GroupCommit and WithTx), so a turn
// held for seconds holds up every write of the process, lease renewals
// included; a watchdog that sees one can dump the process's goroutines
// while the holder is still at it, and so name what holds the writer.
func (db *DB) WriterState() WriterState {
	q := &db.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	ws := WriterState{Waiting: len(q.waiting), Renewals: len(q.renewals)}
	if q.held {
		ws.Held = time.Since(q.heldAt)
	}
	return ws
}
