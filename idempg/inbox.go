package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// Inbox is an idem.Inbox whose records live in the table idem_inbox of a
// DB's schema, next to the consumer's own tables, so that a handler's
// writes and the record of its message commit in one transaction. It is
// also an idem.SequenceInbox, whose marks live in the table
// idem_inbox_sequences, one row per (consumer, aggregate). It is safe for
// concurrent use, by many goroutines and many processes.
type Inbox struct {
	db *DB
}

var (
	_ idem.BatchInbox    = (*Inbox)(nil)
	_ idem.SequenceInbox = (*Inbox)(nil)
)

// NewInbox applies the message tables' migrations to db (component
// "idem_messages") and returns an Inbox on it.
func NewInbox(ctx context.Context, db *DB) (*Inbox, error) {
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Inbox{db: db}, nil
}

// Process implements idem.Inbox. It inserts the (consumer, dedupKey) row
// with INSERT ... ON CONFLICT DO NOTHING and, when a row was inserted, runs
// fn in the same transaction; when none was, the message was processed and
// Process returns idem.ErrDuplicate without running fn. A delivery of the
// same message running concurrently waits, in that INSERT, for the first
// one's transaction to end: it is a duplicate if the first committed, and
// runs fn if the first rolled back. processed_at is the DB's clock (see
// Config.Clock).
//
// fn's context carries the transaction: the handler reaches it with
// db.WithTx(ctx, …), which joins it, so its writes commit with the row.
//
// When ctx carries no transaction of db, Process begins one (with
// Config.TxOptions; BEGIN travels with the INSERT), commits it when fn
// returns nil, and rolls it back when fn fails, returning fn's error
// unchanged. When ctx carries one (an enclosing WithTx), Process joins it
// inside a savepoint: when fn fails, it rolls back to the savepoint, which
// undoes the row and fn's writes and leaves the caller's transaction
// usable; the row commits when the caller's transaction does.
//
// Returns an error matching idem.ErrInvalidArgument when consumer or
// dedupKey is empty or not storable as text (not UTF-8, or holding a NUL
// byte), or fn is nil. Ambiguous failure: when the commit fails (its error
// says "commit"), the row and fn's writes may or may not have been
// committed; a redelivery finds out (idem.ErrDuplicate, or fn runs).
func (in *Inbox) Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	if err := pgsql.CheckName("consumer", consumer); err != nil {
		return err
	}
	if err := pgsql.CheckName("dedupKey", dedupKey); err != nil {
		return err
	}
	if fn == nil {
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if in.db.carried(ctx) != nil {
		return in.processJoined(ctx, consumer, dedupKey, fn)
	}
	err := in.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, pgsql.InboxInsert, consumer, dedupKey, in.db.now())
		switch {
		case err != nil:
			return &inboxError{err}
		case tag.RowsAffected() == 0:
			return idem.ErrDuplicate
		}
		return fn(ctx)
	})
	return inboxErr(err)
}

// processJoined is Process in the transaction ctx carries, inside a
// savepoint.
func (in *Inbox) processJoined(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	err := in.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return &inboxError{err}
		}
		tag, err := sp.Exec(ctx, pgsql.InboxInsert, consumer, dedupKey, in.db.now())
		if err == nil && tag.RowsAffected() == 0 {
			err = idem.ErrDuplicate
		}
		if err == nil {
			err = fn(ctx)
		} else if !errors.Is(err, idem.ErrDuplicate) {
			err = &inboxError{err}
		}
		if err != nil {
			// Rolled back even when ctx is done, so that the caller's
			// transaction stays usable.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			defer cancel()
			if rerr := sp.Rollback(rctx); rerr != nil && errors.Is(err, idem.ErrDuplicate) {
				return &inboxError{rerr}
			}
			// A failed rollback after fn failed leaves the caller's
			// transaction failed: its commit fails, so fn's error is the
			// one to return.
			return err
		}
		if err := sp.Commit(ctx); err != nil {
			return &inboxError{err}
		}
		return nil
	})
	return inboxErr(err)
}

// inboxInsertManySQL records many messages in one statement, in the keys'
// order, so that concurrent batches sharing keys wait for each other's
// rows in one order and never in a cycle. It returns the keys it inserted:
// the others were recorded already (or by a concurrent transaction that
// committed, for which ON CONFLICT waited).
const inboxInsertManySQL = `INSERT INTO idem_inbox (consumer, dedup_key, processed_at)
	SELECT $1, k, coalesce($3::timestamptz, clock_timestamp()) FROM unnest($2::text[]) AS k ORDER BY k
	ON CONFLICT (consumer, dedup_key) DO NOTHING
	RETURNING dedup_key`

// ProcessBatch implements idem.BatchInbox: one INSERT … ON CONFLICT DO
// NOTHING records every key (travelling with BEGIN), fn runs in the same
// transaction, and one COMMIT ends it. It joins the transaction ctx
// carries inside a savepoint, as Process does. Arguments are checked as
// Process checks them, and a repeated key is refused too.
func (in *Inbox) ProcessBatch(ctx context.Context, consumer string, dedupKeys []string, fn func(ctx context.Context, fresh []bool) error) error {
	if err := pgsql.CheckName("consumer", consumer); err != nil {
		return err
	}
	seen := make(map[string]int, len(dedupKeys))
	for i, k := range dedupKeys {
		if err := pgsql.CheckName("dedupKey", k); err != nil {
			return err
		}
		if _, dup := seen[k]; dup {
			return &idem.ArgumentError{Field: "dedupKeys", Reason: fmt.Sprintf("holds %q twice", k)}
		}
		seen[k] = i
	}
	if fn == nil {
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	record := func(ctx context.Context, q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}) ([]bool, error) {
		fresh := make([]bool, len(dedupKeys))
		rows, err := q.Query(ctx, inboxInsertManySQL, consumer, dedupKeys, in.db.now())
		if err != nil {
			return nil, &inboxError{err}
		}
		var k string
		if _, err := pgx.ForEachRow(rows, []any{&k}, func() error {
			fresh[seen[k]] = true
			return nil
		}); err != nil {
			return nil, &inboxError{err}
		}
		return fresh, nil
	}
	if in.db.carried(ctx) != nil {
		err := in.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return &inboxError{err}
			}
			fresh, err := record(ctx, sp)
			if err == nil {
				err = fn(ctx, fresh)
			}
			if err != nil {
				// Rolled back even when ctx is done, so that the caller's
				// transaction stays usable.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
				defer cancel()
				_ = sp.Rollback(rctx)
				return err
			}
			if err := sp.Commit(ctx); err != nil {
				return &inboxError{err}
			}
			return nil
		})
		return inboxErr(err)
	}
	err := in.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		fresh, err := record(ctx, tx)
		if err != nil {
			return err
		}
		return fn(ctx, fresh)
	})
	return inboxErr(err)
}

// sequenceMarkSQL reads the mark of (consumer, aggregate) and locks its
// row until the transaction ends, creating the row (mark 0) when there is
// none, in one round trip. Under READ COMMITTED, FOR UPDATE waits for a
// transaction that holds the row and then reads the mark it committed. A
// row another transaction is creating is not visible yet: the INSERT then
// waits for that transaction and inserts (it rolled back) or nothing (it
// committed), and the statement returns no row; run again, its new
// snapshot finds the committed row and locks it.
const sequenceMarkSQL = `WITH locked AS (
		SELECT mark FROM idem_inbox_sequences
		WHERE consumer = $1 AND aggregate = $2
		FOR UPDATE
	), created AS (
		INSERT INTO idem_inbox_sequences (consumer, aggregate, mark, updated_at)
		SELECT $1, $2, 0, coalesce($3::timestamptz, clock_timestamp())
		WHERE NOT EXISTS (SELECT FROM locked)
		ON CONFLICT (consumer, aggregate) DO NOTHING
		RETURNING mark
	)
	SELECT mark::text FROM locked UNION ALL SELECT mark::text FROM created`

// sequenceMarkTries bounds the runs of sequenceMarkSQL in one call: a
// second run finds the row the first waited for, unless it was deleted in
// between.
const sequenceMarkTries = 3

// raiseMarkSQL sets the mark, once fn has succeeded. The row is locked by
// this transaction, so the UPDATE branch is taken; the INSERT branch only
// keeps the mark from being lost should fn itself have deleted the row.
// The mark travels as text: numeric(20, 0) holds every uint64, which pgx
// would refuse past 2^63-1.
const raiseMarkSQL = `INSERT INTO idem_inbox_sequences (consumer, aggregate, mark, updated_at)
	VALUES ($1, $2, $3::text::numeric, coalesce($4::timestamptz, clock_timestamp()))
	ON CONFLICT (consumer, aggregate) DO UPDATE SET mark = excluded.mark, updated_at = excluded.updated_at`

// ProcessSequence implements idem.SequenceInbox. One statement reads the
// mark of (consumer, aggregate) and locks its row (SELECT ... FOR UPDATE,
// creating it with mark 0 the first time), travelling with BEGIN; when seq
// is a duplicate or a held gap, the transaction is rolled back at once,
// which releases the row. Otherwise fn runs in the transaction, and the new
// mark travels with the COMMIT, so the call costs the round trips of
// Process. Concurrent calls of one aggregate, on any replica, wait for the
// row lock and then read the mark the holder left. updated_at is the DB's
// clock (see Config.Clock).
//
// The transaction, its context and joining the caller's transaction in a
// savepoint are as for Process. Marks are never purged (PurgeInbox deletes
// idem_inbox rows only): the table holds one row per aggregate.
//
// Returns an error matching idem.ErrInvalidArgument for the arguments
// idem.CheckSequenceArgs refuses, and when consumer or aggregate is not
// storable as text. Ambiguous failure: when the commit fails (its error
// says "commit"), the mark and fn's writes may or may not have been
// committed; a redelivery finds out (idem.ErrDuplicate, or fn runs).
func (in *Inbox) ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(ctx context.Context) error) error {
	if err := idem.CheckSequenceArgs(consumer, aggregate, seq, gap, fn); err != nil {
		return err
	}
	if err := pgsql.CheckText("consumer", consumer); err != nil {
		return err
	}
	if err := pgsql.CheckText("aggregate", aggregate); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	raise := &stmt{raiseMarkSQL, []any{consumer, aggregate, strconv.FormatUint(seq, 10), in.db.now()}}
	if in.db.carried(ctx) != nil {
		return in.processSequenceJoined(ctx, consumer, aggregate, seq, gap, raise, fn)
	}
	st, txCtx := in.db.newTx(ctx)
	defer st.rollback(false)
	mark, err := in.readMark(txCtx, st.tx, consumer, aggregate)
	if err != nil {
		return inboxErr(err)
	}
	if err := idem.CheckSequence(aggregate, mark, seq, gap); err != nil {
		return err
	}
	if err := fn(txCtx); err != nil {
		return err
	}
	if _, err := st.commit(raise, false); err != nil {
		if _, ok := err.(*txError); !ok {
			// The server refused the statement: nothing was committed.
			err = &inboxError{err}
		}
		return inboxErr(err)
	}
	return nil
}

// processSequenceJoined is ProcessSequence in the transaction ctx carries,
// inside a savepoint.
func (in *Inbox) processSequenceJoined(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, raise *stmt, fn func(ctx context.Context) error) error {
	err := in.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return &inboxError{err}
		}
		decided := false // the mark said duplicate or gap: fn did not run
		err = func() error {
			mark, err := in.readMark(ctx, sp, consumer, aggregate)
			if err != nil {
				return err
			}
			if err := idem.CheckSequence(aggregate, mark, seq, gap); err != nil {
				decided = true
				return err
			}
			if err := fn(ctx); err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, raise.sql, raise.args...); err != nil {
				return &inboxError{err}
			}
			return nil
		}()
		if err != nil {
			// Rolled back even when ctx is done, so that the caller's
			// transaction stays usable and the row's lock is released.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			defer cancel()
			if rerr := sp.Rollback(rctx); rerr != nil && decided {
				return &inboxError{rerr}
			}
			// A failed rollback after fn failed leaves the caller's
			// transaction failed: its commit fails, so fn's error is the
			// one to return.
			return err
		}
		if err := sp.Commit(ctx); err != nil {
			return &inboxError{err}
		}
		return nil
	})
	return inboxErr(err)
}

// readMark runs sequenceMarkSQL on q until it returns the mark.
func (in *Inbox) readMark(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, consumer, aggregate string) (uint64, error) {
	for range sequenceMarkTries {
		var text string
		err := q.QueryRow(ctx, sequenceMarkSQL, consumer, aggregate, in.db.now()).Scan(&text)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // created by a transaction that committed meanwhile
		case err != nil:
			return 0, &inboxError{err}
		}
		mark, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			return 0, &inboxError{fmt.Errorf("the mark of aggregate %q is %q: %w", aggregate, text, err)}
		}
		return mark, nil
	}
	return 0, &inboxError{fmt.Errorf("the mark of aggregate %q was created and deleted %d times while it was read", aggregate, sequenceMarkTries)}
}

// inboxError is a failure of the inbox's own statements, as opposed to fn's
// error, which Process returns unchanged.
type inboxError struct{ err error }

func (e *inboxError) Error() string { return e.err.Error() }
func (e *inboxError) Unwrap() error { return e.err }

// inboxErr prefixes the inbox's own errors and a failure to begin or
// commit, and returns fn's error and idem.ErrDuplicate unchanged.
func inboxErr(err error) error {
	switch e := err.(type) {
	case *inboxError:
		return fmt.Errorf("idempg: inbox: %w", e.err)
	case *txError:
		return fmt.Errorf("idempg: inbox: %w", e)
	}
	return err
}

// PurgeInbox deletes at most limit inbox rows recorded before olderThan,
// and returns how many it deleted. Call it until it returns fewer than
// limit; a limit of about a thousand keeps each statement short. Called with
// a context that carries a transaction of the DB, it joins it.
//
// Rows are dated by the DB's clock when they are recorded (Config.Clock, or
// the database's clock when that is nil), so olderThan should come from the
// same clock. A row must outlive every redelivery of its message: purge
// only rows older
// than the longest time the transport may still deliver a message again
// (see the package documentation, "Messages"). Returns an error matching
// idem.ErrInvalidArgument when limit is not positive.
func (in *Inbox) PurgeInbox(ctx context.Context, olderThan time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	q, err := in.db.writeQuerier(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempg: purge inbox: %w", err)
	}
	tag, err := q.Exec(ctx, pgsql.PurgeInbox, olderThan, int64(limit))
	if err != nil {
		return 0, fmt.Errorf("idempg: purge inbox: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
