package idempgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// Inbox is an idem.Inbox whose records live in the table idem_inbox of a
// DB's schema, next to the consumer's own tables, so that a handler's
// writes and the record of its message commit in one transaction. It is
// safe for concurrent use, by many goroutines and many processes, and by
// idempg's Inbox on the same schema at once.
type Inbox struct {
	db *DB
}

var _ idem.Inbox = (*Inbox)(nil)

// NewInbox applies the message tables' migrations to db (component
// "idem_messages", shared with idempg) and returns an Inbox on it.
func NewInbox(ctx context.Context, db *DB) (*Inbox, error) {
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Inbox{db: db}, nil
}

// migrateMessages applies the message tables' migrations to db.
func migrateMessages(ctx context.Context, db *DB) error {
	if db == nil {
		return &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	return db.Migrate(ctx, pgsql.MessagesComponent, pgsql.Messages)
}

// Process implements idem.Inbox. It inserts the (consumer, dedupKey) row
// with INSERT ... ON CONFLICT DO NOTHING and, when a row was inserted, runs
// fn in the same transaction; when none was, the message was processed and
// Process returns idem.ErrDuplicate without running fn. A delivery of the
// same message running concurrently waits, in that INSERT, for the first
// one's transaction to end: it is a duplicate if the first committed, and
// runs fn if the first rolled back.
//
// fn's context carries the transaction: the handler reaches it with
// db.WithTx(ctx, ...), which joins it, so its writes commit with the row.
//
// When ctx carries no transaction of db's database, Process begins one
// (with Config.TxOptions), commits it when fn returns nil, and rolls it
// back when fn fails, returning fn's error unchanged. At REPEATABLE READ
// or SERIALIZABLE, a concurrent delivery that committed after the
// transaction's snapshot fails the INSERT with a serialization failure
// before fn runs; Process then begins again (up to five times), and the
// new snapshot sees the row: a duplicate, as at READ COMMITTED.
//
// When ctx carries one (an enclosing WithTx or Process, or the
// application's own through JoinTx), Process joins it inside a savepoint of
// its own: when fn fails, or the message is a duplicate, it rolls back to
// the savepoint, which undoes the row and everything fn wrote, nested
// Process calls included, and nothing else, and the caller's transaction
// goes on; the row commits when the caller's transaction does. fn's
// context carries the savepoint: calls made with it nest inside it. Calls
// in the same transaction from any other context while fn runs (another
// goroutine's, or a context from outside fn) are refused with ErrTxBusy.
// In a transaction above READ COMMITTED, a delivery that another
// transaction committed after this one's snapshot returns the
// serialization failure (Classify: transient) rather than
// idem.ErrDuplicate, which the snapshot cannot see: the transaction is
// still usable, and a delivery in a new transaction is a duplicate.
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
	if r := in.db.carried(ctx); r != nil {
		call := fmt.Sprintf("Inbox.Process(%q, %q)", consumer, dedupKey)
		err := in.db.inSavepoint(ctx, r, call, true, func(ctx context.Context, tx *sql.Tx) error {
			return in.record(ctx, tx, consumer, dedupKey, fn)
		})
		if ie := (*inboxError)(nil); errors.As(err, &ie) && !errors.Is(err, ErrTxAborted) {
			return fmt.Errorf("idempgsql: inbox: %w", usable(ie.err))
		}
		return inboxErr(err)
	}
	for attempt := 1; ; attempt++ {
		ran := false
		err := in.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			return in.record(ctx, tx, consumer, dedupKey, func(ctx context.Context) error {
				ran = true
				return fn(ctx)
			})
		})
		var ie *inboxError
		if !ran && attempt < maxInboxAttempts && errors.As(err, &ie) && SQLState(ie.err) == serializationFailure && ctx.Err() == nil {
			continue
		}
		return inboxErr(err)
	}
}

// maxInboxAttempts bounds how often Process begins again after its INSERT
// failed with a serialization failure.
const maxInboxAttempts = 5

// record inserts the message's row in tx and, when it is new, runs fn.
func (in *Inbox) record(ctx context.Context, tx *sql.Tx, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	res, err := tx.ExecContext(ctx, pgsql.InboxInsert, consumer, dedupKey, in.db.now())
	if err != nil {
		return &inboxError{err}
	}
	if n, err := res.RowsAffected(); err != nil {
		return &inboxError{err}
	} else if n == 0 {
		return idem.ErrDuplicate
	}
	return fn(ctx)
}

// inboxError is a failure of the inbox's own statements, as opposed to
// fn's error or idem.ErrDuplicate.
type inboxError struct{ err error }

func (e *inboxError) Error() string { return e.err.Error() }
func (e *inboxError) Unwrap() error { return e.err }

// inboxErr prefixes the inbox's own errors and a failure to begin or
// commit, and returns fn's error and idem.ErrDuplicate unchanged.
func inboxErr(err error) error {
	var se *savepointError
	switch e := err.(type) {
	case *inboxError:
		return fmt.Errorf("idempgsql: inbox: %w", e.err)
	case *txError:
		return fmt.Errorf("idempgsql: inbox: %w", e)
	}
	switch {
	case errors.As(err, &se), errors.Is(err, ErrTxBusy), errors.Is(err, errTxEnded), errors.Is(err, errCallReturned):
		return fmt.Errorf("idempgsql: inbox: %w", err)
	}
	return err
}

// PurgeInbox deletes at most limit inbox rows recorded before olderThan,
// oldest first, skipping rows another transaction holds, and returns how
// many it deleted. Call it until it returns fewer than limit; a limit of
// about a thousand keeps each statement short. Called with a context that
// carries a transaction of the DB, it joins it.
//
// Rows are dated by the DB's clock when they are recorded (Config.Clock, or
// the database's clock when that is nil), so olderThan should come from the
// same clock. A row must outlive every redelivery of its message: purge
// only rows older than the longest time the transport may still deliver a
// message again. Returns an error matching idem.ErrInvalidArgument when
// limit is not positive.
func (in *Inbox) PurgeInbox(ctx context.Context, olderThan time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	var n int64
	err := in.db.statement(ctx, "Inbox.PurgeInbox", func(ctx context.Context, q querier, _ *txState) error {
		res, err := q.ExecContext(ctx, pgsql.PurgeInbox, olderThan, int64(limit))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idempgsql: purge inbox: %w", err)
	}
	return int(n), nil
}
