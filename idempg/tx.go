package idempg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
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

// txState is a transaction carried by a context. Its connection is taken
// from the pool when a statement first needs it, and BEGIN travels in one
// round trip with the transaction's first statement (see carriedTx); the
// transaction is committed or rolled back by whoever created it (WithTx or
// CompleteTx), never by a callee that joined it, and its COMMIT travels in
// one round trip with the statements that must precede and follow it (see
// commit).
type txState struct {
	db *DB
	// ctx takes the connection and commits. It is the owner's context, so a
	// callee's shorter deadline cannot end a transaction that outlives the
	// call.
	ctx context.Context
	// outer is the transaction of another DB that the context carried
	// already, so that transactions of two databases can nest.
	outer *txState
	// beginSQL and commitSQL begin and commit the transaction.
	beginSQL, commitSQL string
	// tx is what WithTx hands to its fn: the same value for every joiner.
	tx *carriedTx

	mu   sync.Mutex
	conn *pgxpool.Conn // nil until a statement needs it
	// ended is set by the first commit or rollback; endedByTx when that
	// was the handed-out pgx.Tx's Commit or Rollback, not the owner's.
	ended, endedByTx bool
	// wakes are the keys the transaction changed whose waiters its commit
	// wakes (see Store.WaitChange).
	wakes []wake
	// savepoints numbers the savepoints of carriedTx.Begin.
	savepoints int
	// pgxTx is a pgx transaction object on the connection, made only for
	// LargeObjects, which pgx lets no other type provide.
	pgxTx pgx.Tx
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

// newTx returns a transaction with Config.TxOptions, and a context that
// carries it.
func (db *DB) newTx(ctx context.Context) (*txState, context.Context) {
	outer, _ := ctx.Value(txKey{}).(*txState)
	st := db.ownTx(ctx, db.beginSQL, db.commitSQL)
	st.outer = outer
	return st, context.WithValue(ctx, txKey{}, st)
}

// ownTx returns a transaction that no context carries: the store's own
// short transactions, which begin with beginSQL whatever Config.TxOptions
// say.
func (db *DB) ownTx(ctx context.Context, beginSQL, commitSQL string) *txState {
	st := &txState{db: db, ctx: ctx, beginSQL: beginSQL, commitSQL: commitSQL}
	st.tx = &carriedTx{st: st}
	return st
}

// beginSQL is pgx's BEGIN statement for opts.
func beginSQL(opts pgx.TxOptions) string {
	if opts.BeginQuery != "" {
		return opts.BeginQuery
	}
	var b strings.Builder
	b.WriteString("begin")
	if opts.IsoLevel != "" {
		b.WriteString(" isolation level " + string(opts.IsoLevel))
	}
	if opts.AccessMode != "" {
		b.WriteString(" " + string(opts.AccessMode))
	}
	if opts.DeferrableMode != "" {
		b.WriteString(" " + string(opts.DeferrableMode))
	}
	return b.String()
}

// inTx reports whether c is inside a transaction block (open or failed).
// The status is the server's, from its last ReadyForQuery.
func inTx(c *pgxpool.Conn) bool {
	s := c.Conn().PgConn().TxStatus()
	return s == 'T' || s == 'E'
}

// use returns the transaction's connection, taking it from the pool if it
// has none yet.
func (st *txState) use() (*pgxpool.Conn, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return nil, errTxEnded
	}
	if st.conn == nil {
		c, err := st.db.pool.Acquire(st.ctx)
		if err != nil {
			return nil, err
		}
		st.conn = c
	}
	return st.conn, nil
}

// begun returns the transaction if it has begun and not ended, else nil.
func (st *txState) begun() *carriedTx {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended || st.conn == nil || !inTx(st.conn) {
		return nil
	}
	return st.tx
}

// isEnded reports whether the transaction has been committed or rolled back.
func (st *txState) isEnded() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ended
}

// begin begins the transaction on its own round trip, if it has not begun,
// for what cannot carry BEGIN along (see carriedTx).
func (st *txState) begin(ctx context.Context) (*pgxpool.Conn, error) {
	c, err := st.use()
	if err != nil {
		return nil, err
	}
	if !inTx(c) {
		if _, err := c.Exec(ctx, st.beginSQL); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// wake is a key whose waiters a commit wakes.
type wake struct {
	channel    string
	scope, key string
}

// addWake makes the commit wake the waiters of a key (see Store.WaitChange).
func (st *txState) addWake(w wake) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.wakes = append(st.wakes, w)
}

// stmt is a statement with its arguments.
type stmt struct {
	sql  string
	args []any
}

// commit commits the transaction. Everything goes in one round trip: BEGIN
// if the transaction has not begun and there is a last statement, the last
// statement, COMMIT, and then, each in a transaction of its own, the
// wake-ups of the keys the transaction changed. last is part of the
// transaction: when it fails, the transaction is rolled back.
//
// The error of last is returned as it is: the server refused it, so nothing
// was committed. Any other failure is a *txError: "begin" when the
// transaction could not even start, "commit" otherwise, which may hide a
// commit that happened (the connection failed after the pipeline was sent),
// unless it is pgx.ErrTxCommitRollback.
//
// Only the first commit or rollback does anything: a later commit by the
// owner returns nil, or pgx.ErrTxClosed when the handed-out pgx.Tx ended the
// transaction; a later one by the handed-out pgx.Tx (byTx) returns
// pgx.ErrTxClosed.
func (st *txState) commit(last *stmt, byTx bool) (pgconn.CommandTag, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		if st.endedByTx || byTx {
			return pgconn.CommandTag{}, &txError{"commit", pgx.ErrTxClosed}
		}
		return pgconn.CommandTag{}, nil
	}
	st.ended, st.endedByTx = true, byTx
	if st.conn == nil {
		if last == nil {
			return pgconn.CommandTag{}, nil // nothing was begun
		}
		c, err := st.db.pool.Acquire(st.ctx)
		if err != nil {
			return pgconn.CommandTag{}, &txError{"begin", err}
		}
		st.conn = c
	}
	defer st.release()
	c := st.conn
	begun := inTx(c)
	if !begun && last == nil {
		return pgconn.CommandTag{}, nil // no statement ever began it
	}
	if last == nil && len(st.wakes) == 0 {
		tag, err := c.Exec(st.ctx, st.commitSQL)
		return pgconn.CommandTag{}, commitResult(tag, err)
	}
	b := &pgx.Batch{}
	if !begun {
		b.Queue(st.beginSQL)
	}
	if last != nil {
		b.Queue(last.sql, last.args...)
	}
	b.Queue(st.commitSQL)
	for _, w := range st.wakes {
		b.Queue(pgsql.Wake, w.channel, pgsql.NotifyID(idem.Scope(w.scope), idem.Key(w.key)), w.scope, w.key)
	}
	res := c.SendBatch(st.ctx, b)
	var tag pgconn.CommandTag
	err := func() error {
		if !begun {
			if _, err := res.Exec(); err != nil {
				return statementResult("begin", err)
			}
		}
		if last != nil {
			var err error
			if tag, err = res.Exec(); err != nil {
				return statementResult("", err)
			}
		}
		return commitResult(res.Exec())
	}()
	// Once COMMIT has answered, a failure of what follows it (the
	// wake-ups, in transactions of their own) does not undo the commit: it
	// only costs the waiters a wait until their next look.
	res.Close()
	return tag, err
}

// queryRowThenRollback runs sql as the transaction's last statement and
// rolls the transaction back in the same round trip: the row's Scan sends
// both. The transaction must have begun.
func (st *txState) queryRowThenRollback(ctx context.Context, sql string, args ...any) pgx.Row {
	return scanFunc(func(dest ...any) error {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.ended || st.conn == nil {
			return errTxEnded
		}
		st.ended = true
		defer st.release() // rolls back if the ROLLBACK below did not run
		b := &pgx.Batch{}
		b.Queue(sql, args...)
		b.Queue("rollback")
		res := st.conn.SendBatch(ctx, b)
		err := res.QueryRow().Scan(dest...)
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// scanFunc is a pgx.Row whose Scan is the function.
type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

// commitResult interprets the result of COMMIT.
func commitResult(tag pgconn.CommandTag, err error) error {
	switch {
	case err != nil:
		return &txError{"commit", err}
	case tag.String() == "ROLLBACK":
		return &txError{"commit", pgx.ErrTxCommitRollback}
	}
	return nil
}

// statementResult interprets the failure of a statement sent in one
// pipeline with the COMMIT. A refusal by the server (a *pgconn.PgError)
// means the statements after it, the COMMIT included, were skipped, and a
// failure before anything was sent committed nothing either: those are
// returned as they are (wrapped as a "begin" failure for BEGIN). Any other
// failure may have come after the server ran everything, so it is reported
// as the commit's.
func statementResult(op string, err error) error {
	var (
		pgErr   *pgconn.PgError
		prepErr pgx.ErrPreprocessingBatch
	)
	switch {
	case !errors.As(err, &pgErr) && !errors.As(err, &prepErr) && !pgconn.SafeToRetry(err):
		return &txError{"commit", err}
	case op != "":
		return &txError{op, err}
	}
	return err
}

// rollback rolls the transaction back, if it began. Only the first commit or
// rollback does anything: a later rollback returns nil, or pgx.ErrTxClosed
// when byTx (the handed-out pgx.Tx's Rollback) comes after the end.
func (st *txState) rollback(byTx bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		if byTx {
			return pgx.ErrTxClosed
		}
		return nil
	}
	st.ended, st.endedByTx = true, byTx
	if st.conn == nil {
		return nil
	}
	return st.release()
}

// release rolls back what is still open on the connection and gives it back
// to the pool. Called with st.mu held.
func (st *txState) release() error {
	c := st.conn
	st.conn, st.pgxTx = nil, nil
	var err error
	if !c.Conn().IsClosed() && inTx(c) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), rollbackTimeout)
		_, err = c.Exec(ctx, "rollback")
		cancel()
	}
	// The pool closes a connection that is not idle (a failed rollback).
	c.Release()
	return err
}

// WithTx runs fn in a transaction and passes it the transaction, and a
// context that carries it.
//
// When ctx already carries a transaction of this DB (from an enclosing
// WithTx or Store.CompleteTx), fn joins it: it gets that transaction, and
// WithTx neither commits nor rolls back; the enclosing owner does, when it
// ends. An error from fn is returned as is, and does not by itself undo fn's
// writes: the owner decides, so return it up to the owner. (After a failed
// statement PostgreSQL refuses every further statement of the transaction
// until it ends, so the owner cannot commit it by mistake.)
//
// Otherwise WithTx starts a transaction with Config.TxOptions, commits it
// when fn returns nil, and rolls it back when fn returns an error (returned
// unchanged) or panics (the panic goes on). Nested WithTx calls and Store
// methods made with the context fn receives join this transaction.
//
// The transaction takes a pool connection when its first statement runs,
// and BEGIN is sent in the same round trip as that statement (see the
// package documentation, "Transactions: round trips"): a fn that runs no
// statement costs no round trip at all, and a failure to begin is the error
// of fn's first statement.
//
// The pgx.Tx is one connection: do not use it from several goroutines at
// once, nor after WithTx returned. Ambiguous failure: when the commit itself
// fails (for example the connection is lost during COMMIT), the error says
// "commit" and fn's writes may or may not have been committed.
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
		if st.isEnded() {
			return &txError{"begin", errTxEnded}
		}
		return fn(ctx, st.tx)
	}
	st, txCtx := db.newTx(ctx)
	defer st.rollback(false)
	if err := fn(txCtx, st.tx); err != nil {
		return err
	}
	_, err := st.commit(nil, false)
	return err
}

// querier is what the store's statements run on: the pool, or the
// transaction a context carries.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// carriedTx is the pgx.Tx of a carried transaction. Until the transaction
// has begun, Exec (with arguments), Query and QueryRow send BEGIN in one
// pipeline with their statement, so beginning costs no round trip of its
// own; the other methods begin on a round trip of their own first. Its
// methods fail with pgx.ErrTxClosed once the transaction has ended.
type carriedTx struct{ st *txState }

var _ pgx.Tx = (*carriedTx)(nil)

// pipelined reports whether a statement with args can be sent in a batch
// after BEGIN: pgx's batches take no per-statement query options.
func pipelined(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// Exec runs sql in the transaction. Without arguments pgx sends sql over
// the simple protocol, which may hold several statements, so BEGIN then
// goes on a round trip of its own.
func (t *carriedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := t.st.use()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if inTx(c) {
		return c.Exec(ctx, sql, args...)
	}
	if len(args) == 0 || !pipelined(args) {
		if _, err := c.Exec(ctx, t.st.beginSQL); err != nil {
			return pgconn.CommandTag{}, err
		}
		return c.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(t.st.beginSQL)
	b.Queue(sql, args...)
	res := c.SendBatch(ctx, b)
	if _, err := res.Exec(); err != nil {
		res.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := res.Exec()
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql in the transaction.
func (t *carriedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := t.st.use()
	if err != nil {
		return &errRows{err: err}, err
	}
	if inTx(c) {
		return c.Query(ctx, sql, args...)
	}
	if !pipelined(args) {
		if _, err := c.Exec(ctx, t.st.beginSQL); err != nil {
			return &errRows{err: err}, err
		}
		return c.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(t.st.beginSQL)
	b.Queue(sql, args...)
	res := c.SendBatch(ctx, b)
	if _, err := res.Exec(); err != nil {
		res.Close()
		return &errRows{err: err}, err
	}
	rows, err := res.Query()
	if err != nil {
		res.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, res: res}, nil
}

// QueryRow runs sql in the transaction; the row's Scan reads its first
// row, like pgx's.
func (t *carriedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := t.st.use()
	if err != nil {
		return &firstRow{rows: &errRows{err: err}}
	}
	if inTx(c) {
		return c.QueryRow(ctx, sql, args...)
	}
	rows, _ := t.Query(ctx, sql, args...)
	return &firstRow{rows: rows}
}

// SendBatch begins the transaction if it has not begun, then sends b in it.
func (t *carriedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c, err := t.st.begin(ctx)
	if err != nil {
		return &errBatch{err: err}
	}
	return c.SendBatch(ctx, b)
}

// CopyFrom begins the transaction if it has not begun, then copies in it.
func (t *carriedTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	c, err := t.st.begin(ctx)
	if err != nil {
		return 0, err
	}
	return c.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Prepare prepares sql on the transaction's connection.
func (t *carriedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	c, err := t.st.use()
	if err != nil {
		return nil, err
	}
	return c.Conn().Prepare(ctx, name, sql)
}

// Begin begins the transaction if it has not begun, then starts a pseudo
// nested transaction: a savepoint.
func (t *carriedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return newSavepoint(ctx, t.st, t)
}

// Commit commits the transaction, ending it for its owner too, whose own
// commit then fails with pgx.ErrTxClosed.
func (t *carriedTx) Commit(ctx context.Context) error {
	_, err := t.st.commit(nil, true)
	var te *txError
	if errors.As(err, &te) {
		return te.err
	}
	return err
}

// Rollback rolls the transaction back, ending it for its owner too, whose
// own commit then fails with pgx.ErrTxClosed.
func (t *carriedTx) Rollback(ctx context.Context) error { return t.st.rollback(true) }

// Conn begins the transaction if it has not begun, with the owner's
// context, and returns its connection (nil if none could be taken).
func (t *carriedTx) Conn() *pgx.Conn {
	c, err := t.st.begin(t.st.ctx)
	if err != nil {
		// A failure to begin shows on the connection's first use.
		if c, err = t.st.use(); err != nil {
			return nil
		}
	}
	return c.Conn()
}

// LargeObjects begins the transaction if it has not begun and returns its
// large objects. pgx lets only its own transaction types provide them, so
// the first call makes one on the connection, with a round trip (BEGIN, or
// an empty statement when the transaction has begun). pgx.Tx gives
// LargeObjects no way to return an error: it panics when that round trip
// fails or the transaction has ended.
func (t *carriedTx) LargeObjects() pgx.LargeObjects {
	lo, err := t.st.largeObjects()
	if err != nil {
		panic(fmt.Sprintf("idempg: LargeObjects: %v", err))
	}
	return lo
}

func (st *txState) largeObjects() (pgx.LargeObjects, error) {
	c, err := st.use()
	if err != nil {
		return pgx.LargeObjects{}, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.pgxTx == nil {
		q := st.beginSQL
		if inTx(c) {
			q = ";"
		}
		tx, err := c.Conn().BeginTx(st.ctx, pgx.TxOptions{BeginQuery: q})
		if err != nil {
			return pgx.LargeObjects{}, err
		}
		st.pgxTx = tx
	}
	return st.pgxTx.LargeObjects(), nil
}

// savepoint is a pseudo nested transaction of a carried transaction.
type savepoint struct {
	parent pgx.Tx
	st     *txState
	name   string
	closed bool
}

func newSavepoint(ctx context.Context, st *txState, parent pgx.Tx) (pgx.Tx, error) {
	c, err := st.begin(ctx)
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	st.savepoints++
	name := fmt.Sprintf("idempg_sp_%d", st.savepoints)
	st.mu.Unlock()
	if _, err := c.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepoint{parent: parent, st: st, name: name}, nil
}

func (sp *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return newSavepoint(ctx, sp.st, sp)
}

// Commit releases the savepoint.
func (sp *savepoint) Commit(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.parent.Exec(ctx, "release savepoint "+sp.name)
	sp.closed = true
	return err
}

// Rollback rolls back to the savepoint.
func (sp *savepoint) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.parent.Exec(ctx, "rollback to savepoint "+sp.name)
	sp.closed = true
	return err
}

func (sp *savepoint) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if sp.closed {
		return 0, pgx.ErrTxClosed
	}
	return sp.parent.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (sp *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if sp.closed {
		return &errBatch{err: pgx.ErrTxClosed}
	}
	return sp.parent.SendBatch(ctx, b)
}

func (sp *savepoint) LargeObjects() pgx.LargeObjects { return sp.parent.LargeObjects() }

func (sp *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.parent.Prepare(ctx, name, sql)
}

func (sp *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if sp.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return sp.parent.Exec(ctx, sql, args...)
}

func (sp *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sp.closed {
		return &errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return sp.parent.Query(ctx, sql, args...)
}

func (sp *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sp.closed {
		return &firstRow{rows: &errRows{err: pgx.ErrTxClosed}}
	}
	return sp.parent.QueryRow(ctx, sql, args...)
}

func (sp *savepoint) Conn() *pgx.Conn { return sp.parent.Conn() }

// batchRows are the rows of a statement sent in a batch after BEGIN: when
// they are done, the batch is closed, which frees the connection.
type batchRows struct {
	pgx.Rows
	res  pgx.BatchResults
	done bool
	err  error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *batchRows) Close() { r.finish() }

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *batchRows) finish() {
	if r.done {
		return
	}
	r.done = true
	r.Rows.Close()
	r.err = r.res.Close()
}

// firstRow is QueryRow's result for rows of carriedTx.Query, scanned as
// pgx's own QueryRow scans.
type firstRow struct{ rows pgx.Rows }

func (r *firstRow) Scan(dest ...any) error {
	rows := r.rows
	defer rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// errRows are the rows of a statement that could not be sent.
type errRows struct{ err error }

func (r *errRows) Close()                                       {}
func (r *errRows) Err() error                                   { return r.err }
func (r *errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *errRows) Next() bool                                   { return false }
func (r *errRows) Scan(...any) error                            { return r.err }
func (r *errRows) Values() ([]any, error)                       { return nil, r.err }
func (r *errRows) RawValues() [][]byte                          { return nil }
func (r *errRows) Conn() *pgx.Conn                              { return nil }
func (r *errRows) TypeMap() *pgtype.Map                         { return nil }

// errBatch is the result of a batch that could not be sent.
type errBatch struct{ err error }

func (b *errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b *errBatch) Query() (pgx.Rows, error)         { return &errRows{err: b.err}, b.err }
func (b *errBatch) QueryRow() pgx.Row                { return &firstRow{rows: &errRows{err: b.err}} }
func (b *errBatch) Close() error                     { return b.err }
func (b *errBatch) Tx() pgx.Tx                       { return nil }
