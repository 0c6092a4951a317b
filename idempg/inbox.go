package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// Inbox is an idem.Inbox whose records live in the table idem_inbox of a
// DB's schema, next to the consumer's own tables, so that a handler's
// writes and the record of its message commit in one transaction. It is
// safe for concurrent use, by many goroutines and many processes.
type Inbox struct {
	db *DB
}

var _ idem.BatchInbox = (*Inbox)(nil)

// NewInbox applies the message tables' migrations to db (component
// "idem_messages") and returns an Inbox on it.
func NewInbox(ctx context.Context, db *DB) (*Inbox, error) {
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Inbox{db: db}, nil
}

// inboxInsertSQL records a message. Under READ COMMITTED (or any level),
// ON CONFLICT waits for a concurrent transaction that inserted the same
// pair: when that one commits, this one inserts nothing (a duplicate);
// when it rolls back, this one inserts. Its command tag counts the rows
// inserted.
const inboxInsertSQL = `INSERT INTO idem_inbox (consumer, dedup_key, processed_at)
	VALUES ($1, $2, coalesce($3::timestamptz, clock_timestamp()))
	ON CONFLICT (consumer, dedup_key) DO NOTHING`

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
	if err := checkName("consumer", consumer); err != nil {
		return err
	}
	if err := checkName("dedupKey", dedupKey); err != nil {
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
		tag, err := tx.Exec(ctx, inboxInsertSQL, consumer, dedupKey, in.db.now())
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
		tag, err := sp.Exec(ctx, inboxInsertSQL, consumer, dedupKey, in.db.now())
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
	if err := checkName("consumer", consumer); err != nil {
		return err
	}
	seen := make(map[string]int, len(dedupKeys))
	for i, k := range dedupKeys {
		if err := checkName("dedupKey", k); err != nil {
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

// purgeInboxSQL deletes up to $2 rows recorded before $1, oldest first,
// through the processed_at index. Rows that another transaction holds (a
// delivery of the same message in flight) are skipped, not waited for.
const purgeInboxSQL = `DELETE FROM idem_inbox AS i
	WHERE (i.consumer, i.dedup_key) IN (
		SELECT consumer, dedup_key FROM idem_inbox
		WHERE processed_at < $1
		ORDER BY processed_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED)`

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
	tag, err := q.Exec(ctx, purgeInboxSQL, olderThan, int64(limit))
	if err != nil {
		return 0, fmt.Errorf("idempg: purge inbox: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
