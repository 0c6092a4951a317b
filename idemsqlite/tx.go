package idemsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrNestedCompleteTx is returned by Store.CompleteTx when ctx already
// carries a transaction of the same DB. CompleteTx must own its transaction,
// because it rolls the work back on its own when the work fails or the lease
// is lost.
var ErrNestedCompleteTx = errors.New("idemsqlite: CompleteTx called with a context that already carries a transaction of the same database")

// errTxEnded is returned when a context outlives the transaction it carries
// (a goroutine that work started and that is still running after CompleteTx
// returned).
var errTxEnded = fmt.Errorf("the transaction carried by the context has ended: %w", sql.ErrTxDone)

type txKey struct{}

// txState is a transaction carried by a context: begun on the writer when
// first needed, and committed or rolled back by whoever created it (WithTx
// or CompleteTx), never by a callee that joined it.
type txState struct {
	db *DB
	// ctx begins the transaction. It is the owner's context, so a callee's
	// shorter deadline cannot end a transaction that outlives the call.
	ctx context.Context
	// outer is the transaction of another DB that the context carried
	// already, so that transactions of two databases can nest.
	outer *txState

	mu sync.Mutex
	tx *sql.Tx
	// group is the shared transaction (see writerQueue) that the
	// transaction is a member of, holding the writer's turn until it ends;
	// nil for a transaction of its own (unsyncedTx's). afterOthers: members
	// joined the group before it, so it may have read their writes before
	// they committed.
	group       *txGroup
	afterOthers bool
	ended       bool
	// turnHeld: the writer's turn was taken for the transaction before it
	// began (withClaimTx), so begin does not queue for it again.
	turnHeld bool
	// detached are the ends of the contexts stmtContext made, released
	// when the transaction ends.
	detached []context.CancelFunc
}

// interruptGrace is how long a statement of a group's member may run on
// once its caller's context has ended, before it is interrupted all the
// same. An interrupted write makes SQLite roll back the whole transaction,
// every member's writes with it; the grace spares the others that for any
// statement that ends within it, and still stops one that would hold the
// writer for ever.
const interruptGrace = 5 * time.Second

// stmtContext returns the context st's statements run with, given the
// caller's ctx: ctx itself for a transaction of its own; for a member of
// a group, a context with ctx's values whose end comes interruptGrace
// after ctx's (see interruptGrace). A member whose caller's context ends
// so finishes the statement it runs, and is rolled back on its own when
// it ends (see run and end). st has begun.
func (st *txState) stmtContext(ctx context.Context) context.Context {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.group == nil || ctx.Done() == nil || st.ended {
		return ctx
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(interruptGrace, cancel) })
	st.detached = append(st.detached, func() {
		stop()
		cancel()
	})
	return dctx
}

// carried returns the transaction of db that ctx carries, or nil.
func (db *DB) carried(ctx context.Context) *txState {
	st, _ := ctx.Value(txKey{}).(*txState)
	for ; st != nil; st = st.outer {
		if st.db == db {
			return st
		}
	}
	return nil
}

func (db *DB) newTx(ctx context.Context) (*txState, context.Context) {
	outer, _ := ctx.Value(txKey{}).(*txState)
	st := &txState{db: db, ctx: ctx, outer: outer}
	return st, context.WithValue(ctx, txKey{}, st)
}

// begin returns the transaction, beginning it if it has not been yet.
func (st *txState) begin() (*sql.Tx, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return nil, errTxEnded
	}
	if st.tx == nil {
		if !st.turnHeld {
			if err := st.db.queue.acquire(st.ctx, true); err != nil {
				return nil, err
			}
		}
		st.turnHeld = false
		g, afterOthers, err := st.db.queue.join(st.db.writer)
		if err != nil {
			st.db.queue.release()
			return nil, err
		}
		st.tx, st.group, st.afterOthers = g.tx, g, afterOthers
	}
	return st.tx, nil
}

// begun returns the transaction if it has begun and not ended, else nil.
func (st *txState) begun() *sql.Tx {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return nil
	}
	return st.tx
}

// end commits or rolls back the transaction, if it began. Only the first
// call does anything, so a deferred rollback after a commit is harmless.
//
// A member of a group (see writerQueue) commits by releasing its savepoint
// into the group's transaction, or rolls back to it, and in either case
// returns only once the group has committed or failed: nobody learns
// anything of a member before its group's fate is known. One that commits
// returns the group's outcome. One that rolls back returns nil, unless it
// ran after others in its group and the group failed: it then returns the
// group's failure, which its caller returns instead of its own result (see
// fail).
func (st *txState) end(commit bool) error {
	st.mu.Lock()
	detached := st.detached
	st.detached = nil
	defer func() {
		for _, cancel := range detached {
			cancel()
		}
	}()
	if st.ended || st.tx == nil {
		st.ended = true
		st.mu.Unlock()
		return nil
	}
	st.ended = true
	g := st.group
	if g == nil {
		defer st.mu.Unlock()
		if commit {
			return st.tx.Commit()
		}
		return st.tx.Rollback()
	}
	err := g.leave(commit)
	st.mu.Unlock()
	st.db.queue.release()
	if err != nil {
		return err
	}
	<-g.done
	if !commit && !st.afterOthers {
		return nil
	}
	return g.err
}

// fail rolls the transaction back after its own error err, and returns
// what its caller returns: err, or, when the transaction ran after others
// in a group that then failed, the group's failure as a "commit" error,
// err told but not returned: err may rest on writes that never committed
// (an idem.ErrLeaseLost because a takeover before it in the group had
// changed the key, say), and a caller must not act on it.
func (st *txState) fail(err error) error {
	if gerr := st.end(false); gerr != nil {
		return &txError{"commit", fmt.Errorf("%w (before it, the transaction's own error: %v)", gerr, err)}
	}
	return err
}

// finish commits the transaction after its fn succeeded, unless the
// owner's context ended meanwhile: then, as database/sql does with a
// transaction whose context ends before its commit, it rolls back (only
// this transaction's part of its group) and returns the context's error.
// A commit's failure is a *txError.
func (st *txState) finish() error {
	if err := st.ctx.Err(); err != nil {
		return st.fail(err)
	}
	if err := st.end(true); err != nil {
		return &txError{"commit", err}
	}
	return nil
}

// WithTx runs fn in a write transaction and passes it the transaction, and
// a context that carries it.
//
// When ctx already carries a transaction of this DB (from an enclosing
// WithTx or Store.CompleteTx), fn joins it: it gets that transaction (begun
// now if nothing had begun it yet), and WithTx neither commits nor rolls
// back; the enclosing owner does, when it ends. An error from fn is returned
// as is, and does not by itself undo fn's writes: the owner decides, so
// return it up to the owner.
//
// Otherwise WithTx begins a transaction on the writer connection, commits it
// when fn returns nil, and rolls it back when fn returns an error (returned
// unchanged) or panics (the panic goes on). Nested WithTx calls made with the
// context fn receives join this transaction. When ctx ends before the
// commit, the transaction is rolled back and WithTx returns ctx's error, as
// database/sql does with the context of BeginTx.
//
// The transaction commits together with those queued just before and just
// after it (see the package documentation, "Group commit"): WithTx returns
// once that commit is on disk, and when it fails, WithTx returns an error
// that says "commit" whatever fn returned. The context fn receives is not
// ended by ctx's end at once, but interruptGrace (5s) after it: a statement
// that runs on it when ctx ends finishes, rather than be interrupted, which
// would make SQLite roll back every transaction of the group; the
// transaction is then rolled back on its own. A statement run with another
// context is interrupted when that context ends, and fails the group.
//
// Inside fn use only tx, and ctx for nested calls, and never call tx.Commit
// or tx.Rollback: WithTx ends the transaction. Never use db.Writer(): the
// transaction holds the writer's only connection, so that call would wait
// for the transaction, which waits for fn — a deadlock. Store methods called
// with ctx are safe: they join the transaction.
func (db *DB) WithTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	err := db.withTx(ctx, fn)
	if te, ok := err.(*txError); ok {
		return fmt.Errorf("idemsqlite: %w", te)
	}
	return err
}

// txError is a failure to begin or commit, as opposed to an error of fn.
type txError struct {
	op  string
	err error
}

func (e *txError) Error() string { return e.op + ": " + e.err.Error() }
func (e *txError) Unwrap() error { return e.err }

// withTx is WithTx for the package's own callers, which add their own
// prefix: begin and commit failures come back as a *txError.
func (db *DB) withTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if st := db.carried(ctx); st != nil {
		tx, err := st.begin()
		if err != nil {
			return &txError{"begin", err}
		}
		return fn(st.stmtContext(ctx), tx)
	}
	st, txCtx := db.newTx(ctx)
	return st.run(txCtx, fn)
}

// run begins st, runs fn in it, and commits it when fn returns nil or
// rolls it back, as withTx says.
func (st *txState) run(txCtx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	defer st.end(false)
	tx, err := st.begin()
	if err != nil {
		return &txError{"begin", err}
	}
	if err := fn(st.stmtContext(txCtx), tx); err != nil {
		return st.fail(err)
	}
	return st.finish()
}

// withUnsyncedTx is withTx for writes that a power failure may lose without
// harm: a renewal of a lease (its holder died with the machine), the
// purges of the inbox and the transport (the rows are deleted again next
// time), the transport's settlements and MoveOutbox (see their comments).
// Their commit is not synced to disk (synchronous=NORMAL for that
// transaction alone). A claim alone on the writer commits so too (see
// withClaimTx).
//
// That is safe because of how WAL works: a commit appends its frames to the
// WAL file, and a synced commit fsyncs the whole file, so once any later
// write is durable, so is every unsynced write before it. A process crash
// loses nothing either way: the frames are already with the OS.
//
// A call that joins a transaction carried by ctx leaves durability to that
// transaction's owner.
func (db *DB) withUnsyncedTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return db.unsyncedTx(ctx, false, fn)
}

// withClaimTx is withUnsyncedTx for a key's claim, which joins the group
// commit (see writerQueue) when one is open as its turn comes. An unsynced
// transaction cannot share the group's transaction, so one that reaches the
// writer while a group is open makes the group commit first, and the group
// after it begins anew: with requests in flight, a claim between every two
// completions cut each group short, and a first execution under idemhttp's
// Claim then CompleteTx (see Store.WritesSerially) ran at about 1.1 times
// the hand-written minimum's rate in idem bench (8 in flight), where
// ClaimTx's one transaction ran at 3. Joined, the claim waits for the
// group's commit, one sync that it shares, instead of forcing one: about 2
// times the minimum. Alone, it commits without a sync, as before. A
// joined claim waits for every member behind it in its group: Store.Claim
// renews its lease afterwards when that took long (see Store.fullLease).
func (db *DB) withClaimTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if db.carried(ctx) != nil {
		return db.withTx(ctx, fn)
	}
	// Queued as a synced transaction, so that an open group waits for it.
	if err := db.queue.acquire(ctx, true); err != nil {
		return &txError{"begin", err}
	}
	if db.queue.groupOpen() {
		st, txCtx := db.newTx(ctx)
		st.turnHeld = true
		return st.run(txCtx, fn)
	}
	return db.unsyncedTxHeld(ctx, false, fn)
}

// withHandOutTx is withUnsyncedTx for handing messages out. ctx's end
// interrupts the wait for the writer, the begin and fn's statements, but
// not the commit: interrupted just after it succeeded, a commit would
// report ctx's error, and the caller would drop deliveries that stay held
// for their AckWait. The transaction is detached from ctx just before the
// commit instead, so a hand-out that fails has not committed, and one that
// commits is the caller's to return.
func (db *DB) withHandOutTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return db.unsyncedTx(ctx, true, fn)
}

func (db *DB) unsyncedTx(ctx context.Context, handOut bool, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	if db.carried(ctx) != nil {
		return db.withTx(ctx, fn)
	}
	if err := db.queue.acquire(ctx, false); err != nil {
		return &txError{"begin", err}
	}
	return db.unsyncedTxHeld(ctx, handOut, fn)
}

// unsyncedTxHeld is unsyncedTx once the writer's turn is the caller's; it
// ends the turn.
func (db *DB) unsyncedTxHeld(ctx context.Context, handOut bool, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	defer db.queue.release()
	// The writer pool has one connection: holding it as a *sql.Conn keeps
	// every other writer off it while synchronous is relaxed.
	conn, err := db.writer.Conn(ctx)
	if err != nil {
		return &txError{"begin", err}
	}
	restored := false
	defer func() {
		if !restored {
			// Never hand a connection that skips syncs back to the pool.
			conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		conn.Close()
	}()
	err = func() error {
		if db.testHookRelax != nil {
			db.testHookRelax()
		}
		// Its failure, ctx's end among them, leaves synchronous unknown:
		// it is restored below all the same, and only a connection that
		// cannot be restored is dropped (a heartbeat's short deadline that
		// ended here cost a reopening of the writer).
		if _, err := conn.ExecContext(ctx, "PRAGMA synchronous = NORMAL"); err != nil {
			return &txError{"begin", err}
		}
		txCtx, detach := ctx, func() bool { return true }
		if handOut {
			// The transaction ends with ctx until detach, and not after.
			var cancel context.CancelFunc
			txCtx, cancel = context.WithCancel(context.WithoutCancel(ctx))
			defer cancel()
			detach = context.AfterFunc(ctx, cancel)
			defer detach()
		}
		tx, err := conn.BeginTx(txCtx, nil)
		if err != nil {
			return &txError{"begin", err}
		}
		outer, _ := ctx.Value(txKey{}).(*txState)
		st := &txState{db: db, ctx: ctx, outer: outer, tx: tx}
		defer st.end(false)
		if err := fn(context.WithValue(ctx, txKey{}, st), tx); err != nil {
			return err
		}
		if !detach() {
			return ctx.Err()
		}
		if err := st.end(true); err != nil {
			return &txError{"commit", err}
		}
		return nil
	}()
	if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "PRAGMA synchronous = FULL"); rerr == nil {
		restored = true
	}
	return err
}
