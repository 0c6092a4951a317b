package idempgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// ErrNestedCompleteTx is returned by Store.CompleteTx when ctx already
// carries a transaction of the same database (one that any DB on the same
// *sql.DB, or on the same database and schema, began or joined).
// CompleteTx must own its transaction, because it rolls the work back on
// its own when the work fails or the lease is lost.
var ErrNestedCompleteTx = errors.New("idempgsql: CompleteTx called with a context that already carries a transaction of the same database")

// ErrTxBusy is returned, having done nothing, by a call made in a
// transaction while an Inbox.Process in the same transaction runs its
// handler, when the call's context is not that handler's: from another
// goroutine, or with a context from outside the handler. Such a call would
// run inside the handler's savepoint, and be undone if the handler failed
// although it had reported success. Make the calls of one transaction one
// after another, and inside a handler use the context it was given. (idem's
// other calls in one transaction, which run no code of the application's,
// are not refused but serialised: each waits for the one before it.)
var ErrTxBusy = errors.New("idempgsql: the transaction is in use by an Inbox.Process handler that this call is not part of")

// ErrTxAborted is matched by the error of a call of idem's in a
// transaction of the application's that failed and could not roll back to
// its savepoint: the transaction is aborted, and only a rollback ends it.
// (When the rollback to the savepoint succeeds, the error says so, and the
// transaction goes on.)
var ErrTxAborted = errors.New("idempgsql: the transaction is aborted: roll it back")

// errTxEnded is returned when a context outlives the transaction it carries
// (a goroutine that work started and that is still running after CompleteTx
// returned).
var errTxEnded = fmt.Errorf("the transaction carried by the context has ended: %w", sql.ErrTxDone)

// errCallReturned is returned when a context outlives the call of idem's
// whose savepoint it carries (a goroutine that an Inbox.Process handler
// started and that is still running after the handler returned).
var errCallReturned = fmt.Errorf("the context is that of an idem call that has returned (a handler's, used after its Process returned): %w", sql.ErrTxDone)

type txKey struct{}

// wakeTimeout bounds the wake-ups sent after a commit, which the commit's
// caller waits for.
const wakeTimeout = 5 * time.Second

// txState is a transaction carried by a context: begun when first needed,
// and committed or rolled back by whoever created it (WithTx, CompleteTx,
// Inbox.Process), never by a callee that joined it. A transaction of the
// caller's (JoinTx) is begun and ended by the caller alone.
type txState struct {
	db *DB
	// ctx begins the transaction. It is the owner's context, so a callee's
	// shorter deadline cannot end a transaction that outlives the call.
	ctx context.Context
	// joined says the transaction is the caller's (JoinTx).
	joined bool

	mu    sync.Mutex
	tx    *sql.Tx
	ended bool
	// draining says that the owner is about to commit (see drain): no
	// call opens a savepoint any more.
	draining bool
	// wakes are the keys whose waiters to wake once the transaction has
	// committed (see Store.wakeAfter).
	wakes []wakeKey
	// top is the innermost savepoint open in the transaction, nil when
	// none is: the calls of idem that run in a transaction each run inside
	// a savepoint of their own (see DB.inSavepoint), and they nest.
	top *savepoint
}

// savepoint is one call of idem's inside a transaction, under its own
// SAVEPOINT.
type savepoint struct {
	parent *savepoint
	name   string
	// call names the call, for errors; handler says that it runs the
	// application's code (Inbox.Process), so that its savepoint may stay
	// open for long and calls from elsewhere are refused rather than
	// made to wait (ErrTxBusy).
	call    string
	handler bool
	// ending says that the call has returned and its savepoint is being
	// ended: the context it handed out opens no savepoint any more.
	ending bool
	closed bool
	done   chan struct{} // closed when the savepoint is closed
}

// savepoints numbers the savepoints of the process, so that no two share a
// name, even in one transaction joined twice (two JoinTx of one *sql.Tx):
// a name means the newest savepoint of that name, and a shared one would
// roll back to another call's.
var savepoints atomic.Uint64

// txRef is what a context carries: a transaction, where in it the
// context's holder runs (at: the savepoint of the call whose code holds
// the context, or nil for the transaction itself), and the transaction of
// another database that the context carried already (outer), so that
// transactions of two databases can nest.
type txRef struct {
	st    *txState
	at    *savepoint
	outer *txRef
}

// wakeKey is a key whose waiters a commit wakes.
type wakeKey struct {
	scope idem.Scope
	key   idem.Key
}

// addWake has the commit wake key's waiters.
func (st *txState) addWake(w wakeKey) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.wakes = append(st.wakes, w)
}

// querier is what a statement runs on: the *sql.DB, where it commits on its
// own, or a transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sameDatabase reports whether db and other work on the same tables: they
// sit on one *sql.DB, or on two whose connections reach the same schema of
// the same database on the same server. A transaction of one is then a
// transaction of the other too.
func (db *DB) sameDatabase(other *DB) bool {
	return db == other || db.sql == other.sql || db.identity == other.identity
}

// carried returns the transaction of db's database that ctx carries, or
// nil.
func (db *DB) carried(ctx context.Context) *txRef {
	r, _ := ctx.Value(txKey{}).(*txRef)
	for ; r != nil; r = r.outer {
		if r.st.db.sameDatabase(db) {
			return r
		}
	}
	return nil
}

// withRef returns ctx carrying r, in front of whatever it carried.
func withRef(ctx context.Context, st *txState, at *savepoint) context.Context {
	outer, _ := ctx.Value(txKey{}).(*txRef)
	return context.WithValue(ctx, txKey{}, &txRef{st: st, at: at, outer: outer})
}

func (db *DB) newTx(ctx context.Context) (*txState, context.Context) {
	st := &txState{db: db, ctx: ctx}
	return st, withRef(ctx, st, nil)
}

// begin returns the transaction, beginning it if it has not been yet.
func (st *txState) begin() (*sql.Tx, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return nil, errTxEnded
	}
	if st.tx == nil {
		tx, err := st.db.sql.BeginTx(st.ctx, &st.db.txOptions)
		if err != nil {
			return nil, err
		}
		st.tx = tx
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
func (st *txState) end(commit bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended || st.tx == nil || st.joined {
		st.ended = true
		return nil
	}
	st.ended = true
	if !commit {
		return st.tx.Rollback()
	}
	if err := st.tx.Commit(); err != nil {
		return err
	}
	if len(st.wakes) > 0 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), wakeTimeout)
		defer cancel()
		for _, w := range st.wakes {
			st.db.wake(ctx, st.db.sql, w.scope, w.key)
		}
	}
	return nil
}

// wait waits until r's holder may run in the transaction: until no
// savepoint of another call is open above r.at. It returns at once when
// that holds; waits for the calls of idem's open above, which run no code
// of the application's and so end by themselves; and returns ErrTxBusy
// when a handler (Inbox.Process) that r's holder is not part of has its
// savepoint open, since that handler may be waiting for r's holder. When
// open is set, it then opens a savepoint above r.at for the call named
// call, returned (its SAVEPOINT is the caller's to send); st.mu is not
// held on return.
func (r *txRef) wait(ctx context.Context, call string, handler, open bool) (*savepoint, error) {
	st := r.st
	for {
		st.mu.Lock()
		switch {
		case st.ended, st.draining:
			st.mu.Unlock()
			return nil, errTxEnded
		case r.at != nil && (r.at.closed || r.at.ending):
			st.mu.Unlock()
			return nil, errCallReturned
		case st.top == r.at:
			var sp *savepoint
			if open {
				sp = &savepoint{parent: r.at, name: "idem_" + strconv.FormatUint(savepoints.Add(1), 10),
					call: call, handler: handler, done: make(chan struct{})}
				st.top = sp
			}
			st.mu.Unlock()
			return sp, nil
		}
		for o := st.top; o != nil && o != r.at; o = o.parent {
			if o.handler {
				st.mu.Unlock()
				return nil, fmt.Errorf("%s: %w (%s is running its handler)", call, ErrTxBusy, o.call)
			}
		}
		done := st.top.done
		st.mu.Unlock()
		testHookBlocked()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// settle waits until sp is the innermost savepoint again, and marks it
// ending: calls that sp's code started with its context and left running
// (a goroutine it did not wait for) end first, inside sp, and none starts
// after.
func (st *txState) settle(sp *savepoint) {
	for {
		st.mu.Lock()
		if st.top == sp {
			sp.ending = true
			st.mu.Unlock()
			return
		}
		done := st.top.done
		st.mu.Unlock()
		testHookBlocked()
		<-done
	}
}

// drain waits until no call of idem's has a savepoint open in the
// transaction, and then refuses new ones (errTxEnded): its owner is about
// to commit. A call that the owner's code started with its context and
// left running (a goroutine it did not wait for) ends first, inside the
// transaction, rather than see the commit take its savepoint as it stands,
// half done, and then fail (or, a Process, have its message recorded
// although its handler did not finish).
func (st *txState) drain() {
	for {
		st.mu.Lock()
		if st.top == nil {
			st.draining = true
			st.mu.Unlock()
			return
		}
		done := st.top.done
		st.mu.Unlock()
		testHookBlocked()
		<-done
	}
}

// testHookBlocked is called as a call blocks, waiting for another to close
// its savepoint: tests learn from it that a wait has begun.
var testHookBlocked = func() {}

// close closes sp, the innermost savepoint, once the statement that ends
// it has run: the next call may then open its own.
func (st *txState) close(sp *savepoint) {
	st.mu.Lock()
	defer st.mu.Unlock()
	sp.closed = true
	if st.top == sp {
		st.top = sp.parent
	}
	close(sp.done)
}

// rollbackTimeout bounds a rollback to a savepoint made after ctx ended.
const rollbackTimeout = 5 * time.Second

// inSavepoint runs fn, the call of idem's named call, in the transaction r
// (beginning it if it has not begun), inside a savepoint of its own:
// when fn fails (or panics, and the panic goes on), the transaction rolls
// back to the savepoint, which undoes exactly what fn wrote, and goes on;
// when fn succeeds, the savepoint is released and its writes are the
// transaction's. fn's context carries the transaction at the savepoint, so
// that the calls fn makes with it nest inside it.
//
// Calls in one transaction from several goroutines are serialised, or
// refused when a handler runs (see txRef.wait). handler says that fn runs
// the application's code.
//
// fn's error comes back as it is when the rollback to the savepoint
// succeeds; when it fails, the error matches ErrTxAborted as well.
func (db *DB) inSavepoint(ctx context.Context, r *txRef, call string, handler bool, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	sp, err := r.wait(ctx, call, handler, true)
	if err != nil {
		return err
	}
	defer r.st.close(sp)
	// A context that has ended sends nothing (database/sql refuses the
	// statement before it reaches the connection): its error is not the
	// transaction's.
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, err := r.st.begin()
	if err != nil {
		return &txError{"begin", err}
	}
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+sp.name); err != nil {
		return &savepointError{call, err}
	}
	// Ended even when ctx is done, so that the transaction stays usable.
	end := func(rollback bool) error {
		r.st.settle(sp)
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if rollback {
			if _, err := tx.ExecContext(ectx, "ROLLBACK TO SAVEPOINT "+sp.name); err != nil {
				return err
			}
		}
		// Released after a rollback too: a savepoint left behind would
		// be the one an enclosing call's rollback went back to, were they
		// to share a name, and it costs the server memory to the end.
		_, err := tx.ExecContext(ectx, "RELEASE SAVEPOINT "+sp.name)
		return err
	}
	panicked := true
	defer func() {
		if panicked {
			end(true)
		}
	}()
	err = fn(withRef(ctx, r.st, sp), tx)
	panicked = false
	if err != nil {
		if rerr := end(true); rerr != nil {
			return fmt.Errorf("%w; and rolling back to its savepoint failed (%w): %w", err, rerr, ErrTxAborted)
		}
		return err
	}
	if rerr := end(false); rerr != nil {
		return &savepointError{call, rerr}
	}
	return nil
}

// savepointError is a failure of a savepoint's own statements: the
// transaction is broken.
type savepointError struct {
	call string
	err  error
}

func (e *savepointError) Error() string {
	return "savepoint of " + e.call + ": " + e.err.Error() + ": " + ErrTxAborted.Error()
}
func (e *savepointError) Unwrap() []error { return []error{e.err, ErrTxAborted} }

// statement runs fn, a call of idem's that runs its own statements and no
// code of the application's, with what it writes with: in the transaction
// ctx carries, inside a savepoint of its own (inSavepoint), so that its
// failure undoes its own writes and leaves the transaction usable (its
// error then says so); or on the *sql.DB, where each statement commits on
// its own. st is the transaction, or nil. Errors of idem's protocol
// (idem.ErrLeaseLost, ...) come back unchanged.
func (db *DB) statement(ctx context.Context, call string, fn func(ctx context.Context, q querier, st *txState) error) error {
	r := db.carried(ctx)
	if r == nil {
		return fn(ctx, db.sql, nil)
	}
	err := db.inSavepoint(ctx, r, call, false, func(ctx context.Context, tx *sql.Tx) error {
		return fn(ctx, tx, r.st)
	})
	return usable(err)
}

// read runs fn, a read of idem's, in the transaction ctx carries when that
// has begun, so that it sees the transaction's writes (inside a savepoint,
// as statement's), and otherwise on the *sql.DB, so that a read does not
// begin a transaction that has written nothing.
func (db *DB) read(ctx context.Context, call string, fn func(ctx context.Context, q querier) error) error {
	if r := db.carried(ctx); r != nil && r.st.begun() != nil {
		return usable(db.inSavepoint(ctx, r, call, false, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, tx) }))
	}
	return fn(ctx, db.sql)
}

// usable marks the error of a call that failed inside its savepoint and
// rolled back to it: the transaction goes on.
func usable(err error) error {
	var se *savepointError
	switch {
	case err == nil, errors.Is(err, ErrTxAborted), errors.Is(err, ErrTxBusy), errors.As(err, &se),
		errors.Is(err, idem.ErrLeaseLost), errors.Is(err, idem.ErrNotFound), errors.Is(err, idem.ErrInvalidArgument),
		errors.Is(err, errTxEnded), errors.Is(err, errCallReturned), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var te *txError
	if errors.As(err, &te) {
		return err
	}
	return &usableError{err}
}

// usableError is the failure of a call of idem's inside a transaction,
// whose own writes were rolled back to its savepoint: the transaction goes
// on.
type usableError struct{ err error }

func (e *usableError) Error() string {
	return e.err.Error() + " (rolled back to its savepoint: the transaction goes on)"
}
func (e *usableError) Unwrap() error { return e.err }

// WithTx runs fn in a transaction and passes it the transaction, and a
// context that carries it.
//
// When ctx already carries a transaction of this DB's database (from an
// enclosing WithTx, Store.CompleteTx, Inbox.Process or JoinTx, through this
// DB or another on the same *sql.DB), fn joins it: it gets that
// transaction (begun now if nothing had begun it yet) and the same ctx, and
// WithTx neither commits nor rolls back; the enclosing owner does, when it
// ends. An error from fn is returned as is, and does not by itself undo
// fn's writes: the owner decides, so return it up to the owner. (idem's own
// calls are the ones that keep their writes to themselves, each in a
// savepoint.) Joining waits for a call of idem's that another goroutine is
// making in the transaction, and is refused with ErrTxBusy while an
// Inbox.Process handler that fn is not part of runs in it.
//
// Otherwise WithTx begins a transaction (with Config.TxOptions), commits it
// when fn returns nil, and rolls it back when fn returns an error (returned
// unchanged) or panics (the panic goes on). Nested WithTx calls made with
// the context fn receives join this transaction. A failed commit returns
// an error that says "commit": the transaction may or may not have
// committed.
//
// Inside fn use only tx, and ctx for nested calls, and never call
// tx.Commit or tx.Rollback: WithTx ends the transaction. A library that
// wants a *sql.Tx (sqlx, Bun, sqlc's WithTx, GORM's Conn) is given tx.
func (db *DB) WithTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	err := db.withTx(ctx, fn)
	if te, ok := err.(*txError); ok {
		return fmt.Errorf("idempgsql: %w", te)
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
	if r := db.carried(ctx); r != nil {
		if _, err := r.wait(ctx, "WithTx", false, false); err != nil {
			return err
		}
		tx, err := r.st.begin()
		if err != nil {
			return &txError{"begin", err}
		}
		return fn(ctx, tx)
	}
	st, txCtx := db.newTx(ctx)
	defer st.end(false)
	tx, err := st.begin()
	if err != nil {
		return &txError{"begin", err}
	}
	if err := fn(txCtx, tx); err != nil {
		return err
	}
	st.drain()
	if err := st.end(true); err != nil {
		return &txError{"commit", err}
	}
	return nil
}

// JoinTx returns a context that carries tx, a transaction the application
// began on the DB's database (with database/sql, or through an ORM that
// exposes its *sql.Tx). Calls made with that context, through this DB or
// any other on the same *sql.DB (or on the same schema of the same
// database), join tx: WithTx's fn gets it, and an Outbox.Add, an
// Inbox.Process, a Store's Claim, Complete and Release, and every other
// call of idem's, write in it, each inside a savepoint of its own, so that
// its failure undoes its own writes and nothing of the application's. They
// commit or roll back when the application ends tx, which is the
// application's alone to end: idem never commits or rolls it back.
// Store.CompleteTx refuses such a context (ErrNestedCompleteTx), since it
// must own its transaction.
//
// When ctx carries tx already (joined further up), JoinTx returns ctx as
// it is: joining one transaction at each layer of an application is
// harmless. Join it once and pass the context down, rather than joining it
// anew from a context that does not carry it: the calls made with
// contexts of two separate JoinTx of one transaction cannot see each
// other, so ErrTxBusy cannot protect them from each other.
//
// tx must be a transaction of the DB's database and schema: one of
// another database would commit idem's rows where idem does not look.
// JoinTx panics when tx is nil.
func (db *DB) JoinTx(ctx context.Context, tx *sql.Tx) context.Context {
	if tx == nil {
		panic("idempgsql: JoinTx with a nil *sql.Tx")
	}
	if r := db.carried(ctx); r != nil && r.st.begun() == tx {
		return ctx
	}
	return withRef(ctx, &txState{db: db, ctx: ctx, joined: true, tx: tx}, nil)
}
