package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNestedCompleteTx is returned by Store.CompleteTx when ctx already
// carries a transaction of the same DB. CompleteTx must own its transaction,
// because it rolls the work back on its own when the work fails or the lease
// is lost.
var ErrNestedCompleteTx = errors.New("idempg: CompleteTx called with a context that already carries a transaction of the same database")

// errTxEnded is returned when a context outlives the transaction it carries
// (a goroutine that work started and that is still running after CompleteTx
// returned).
var errTxEnded = fmt.Errorf("the transaction carried by the context has ended: %w", pgx.ErrTxClosed)

// rollbackTimeout bounds a rollback, which runs even when the owner's
// context is done: rolling back on the connection gives it back to the pool
// in a clean state, where a cancelled rollback would close it.
const rollbackTimeout = 5 * time.Second

type txKey struct{}

// txState is a transaction carried by a context: begun on a pool
// connection when first needed, and committed or rolled back by whoever
// created it (WithTx or CompleteTx), never by a callee that joined it.
type txState struct {
	db *DB
	// ctx begins and commits the transaction. It is the owner's context,
	// so a callee's shorter deadline cannot end a transaction that outlives
	// the call.
	ctx context.Context
	// outer is the transaction of another DB that the context carried
	// already, so that transactions of two databases can nest.
	outer *txState

	mu    sync.Mutex
	tx    pgx.Tx
	ended bool
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
func (st *txState) begin() (pgx.Tx, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return nil, errTxEnded
	}
	if st.tx == nil {
		tx, err := st.db.pool.BeginTx(st.ctx, st.db.txOpts)
		if err != nil {
			return nil, err
		}
		st.tx = tx
	}
	return st.tx, nil
}

// begun returns the transaction if it has begun and not ended, else nil.
func (st *txState) begun() pgx.Tx {
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
	if st.ended {
		return nil
	}
	st.ended = true
	if st.tx == nil {
		return nil
	}
	if commit {
		return st.tx.Commit(st.ctx)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), rollbackTimeout)
	defer cancel()
	return st.tx.Rollback(ctx)
}

// WithTx runs fn in a transaction and passes it the transaction, and a
// context that carries it.
//
// When ctx already carries a transaction of this DB (from an enclosing
// WithTx or Store.CompleteTx), fn joins it: it gets that transaction (begun
// now if nothing had begun it yet), and WithTx neither commits nor rolls
// back; the enclosing owner does, when it ends. An error from fn is returned
// as is, and does not by itself undo fn's writes: the owner decides, so
// return it up to the owner. (After a failed statement PostgreSQL refuses
// every further statement of the transaction until it ends, so the owner
// cannot commit it by mistake.)
//
// Otherwise WithTx begins a transaction with Config.TxOptions on a pool
// connection, commits it when fn returns nil, and rolls it back when fn
// returns an error (returned unchanged) or panics (the panic goes on).
// Nested WithTx calls and Store methods made with the context fn receives
// join this transaction.
//
// A pgx.Tx is one connection: do not use it from several goroutines at
// once. Ambiguous failure: when the commit itself fails (for example the
// connection is lost during COMMIT), the error says "commit" and fn's writes
// may or may not have been committed.
func (db *DB) WithTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	err := db.withTx(ctx, fn)
	if te, ok := err.(*txError); ok {
		return fmt.Errorf("idempg: %w", te)
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
func (db *DB) withTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
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

// querier is what the store's statements run on: the pool, or the
// transaction a context carries.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
