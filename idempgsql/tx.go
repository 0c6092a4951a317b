package idempgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// ErrNestedCompleteTx is returned by Store.CompleteTx when ctx already
// carries a transaction of the same DB. CompleteTx must own its transaction,
// because it rolls the work back on its own when the work fails or the lease
// is lost.
var ErrNestedCompleteTx = errors.New("idempgsql: CompleteTx called with a context that already carries a transaction of the same database")

// errTxEnded is returned when a context outlives the transaction it carries
// (a goroutine that work started and that is still running after CompleteTx
// returned).
var errTxEnded = fmt.Errorf("the transaction carried by the context has ended: %w", sql.ErrTxDone)

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
	// outer is the transaction of another DB that the context carried
	// already, so that transactions of two databases can nest.
	outer *txState
	// joined says the transaction is the caller's (JoinTx).
	joined bool

	mu    sync.Mutex
	tx    *sql.Tx
	ended bool
	// wakes are the keys whose waiters to wake once the transaction has
	// committed (see Store.wakeAfter).
	wakes []wakeKey
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

// writer returns what a write runs on: the transaction ctx carries (begun
// now if it has not been), or the *sql.DB. st is the former, or nil.
func (db *DB) writer(ctx context.Context) (q querier, st *txState, err error) {
	if st := db.carried(ctx); st != nil {
		tx, err := st.begin()
		if err != nil {
			return nil, nil, &txError{"begin", err}
		}
		return tx, st, nil
	}
	return db.sql, nil, nil
}

// reader returns what a read runs on: the transaction ctx carries when it
// has begun, so that the read sees its writes, or else the *sql.DB, so
// that a read does not begin a transaction that has written nothing.
func (db *DB) reader(ctx context.Context) querier {
	if st := db.carried(ctx); st != nil {
		if tx := st.begun(); tx != nil {
			return tx
		}
	}
	return db.sql
}

// WithTx runs fn in a transaction and passes it the transaction, and a
// context that carries it.
//
// When ctx already carries a transaction of this DB (from an enclosing
// WithTx, Store.CompleteTx, Inbox.Process or JoinTx), fn joins it: it gets
// that transaction (begun now if nothing had begun it yet), and WithTx
// neither commits nor rolls back; the enclosing owner does, when it ends.
// An error from fn is returned as is, and does not by itself undo fn's
// writes: the owner decides, so return it up to the owner.
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
	if st := db.carried(ctx); st != nil {
		tx, err := st.begin()
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
	if err := st.end(true); err != nil {
		return &txError{"commit", err}
	}
	return nil
}

// JoinTx returns a context that carries tx, a transaction the application
// began on the DB's *sql.DB itself (with database/sql, or through an ORM
// that exposes its *sql.Tx). Calls made with that context join tx: WithTx's
// fn gets it, an Outbox.Add writes in it, an Inbox.Process records its
// message in it (inside a savepoint), a Store's Claim, Complete and
// Release run in it. They commit or roll back when the application ends
// tx, which is the application's alone to end: idem never commits or rolls
// it back. Store.CompleteTx refuses such a context (ErrNestedCompleteTx),
// since it must own its transaction.
//
// tx must belong to the DB's *sql.DB: a transaction of another database
// would commit idem's rows where idem does not look. JoinTx panics when tx
// is nil.
func (db *DB) JoinTx(ctx context.Context, tx *sql.Tx) context.Context {
	if tx == nil {
		panic("idempgsql: JoinTx with a nil *sql.Tx")
	}
	outer, _ := ctx.Value(txKey{}).(*txState)
	st := &txState{db: db, ctx: ctx, outer: outer, joined: true, tx: tx}
	return context.WithValue(ctx, txKey{}, st)
}
