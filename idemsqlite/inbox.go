package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// Inbox is an idem.Inbox whose records live in the table idem_inbox of a
// DB, next to the consumer's own tables, so that a handler's writes and
// the record of its message commit in one transaction.
type Inbox struct {
	db    *DB
	clock idem.Clock
}

var _ idem.Inbox = (*Inbox)(nil)

// NewInbox applies the message tables' migrations to db (component
// "idem_messages") and returns an Inbox on it.
func NewInbox(ctx context.Context, db *DB) (*Inbox, error) {
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Inbox{db: db, clock: idem.SystemClock{}}, nil
}

// Process implements idem.Inbox. It runs in db.WithTx: in the transaction
// ctx carries, or in one of its own. Inside it, it looks for the
// (consumer, dedupKey) row, returns idem.ErrDuplicate if there is one, and
// otherwise inserts it and runs fn. The single writer connection makes the
// look and the insert one atomic step for every goroutine and, through
// SQLite's write lock, every process.
//
// fn's context carries the transaction: the handler reaches it with
// db.WithTx(ctx, …), which joins it, so its writes commit with the row.
// When fn fails, Process rolls back its own transaction and returns fn's
// error unchanged. When it joined the caller's transaction, rolling back is
// the caller's to do; committing after fn failed would keep the row.
//
// Returns an error matching idem.ErrInvalidArgument when consumer or
// dedupKey is empty. On a failure to commit, the record may or may not have
// been made: a redelivery finds out.
func (in *Inbox) Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case dedupKey == "":
		return &idem.ArgumentError{Field: "dedupKey", Reason: "must not be empty"}
	case fn == nil:
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := in.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx,
			`SELECT 1 FROM idem_inbox WHERE consumer = ? AND dedup_key = ?`, consumer, dedupKey).Scan(&one)
		switch {
		case err == nil:
			return idem.ErrDuplicate
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("idemsqlite: inbox: %w", err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO idem_inbox (consumer, dedup_key, processed_at) VALUES (?, ?, ?)`,
			consumer, dedupKey, in.clock.Now().UnixNano()); err != nil {
			return fmt.Errorf("idemsqlite: inbox: %w", err)
		}
		return fn(ctx)
	})
	return wrapTx("inbox", err)
}

// PurgeInbox deletes at most limit inbox rows recorded before olderThan,
// and returns how many it deleted. Call it until it returns fewer than
// limit; a small limit keeps each transaction short.
//
// A row must outlive every redelivery of its message: purge only rows older
// than the longest time the transport may still deliver a message again
// (see the package documentation). Returns an error matching
// idem.ErrInvalidArgument when limit is not positive.
func (in *Inbox) PurgeInbox(ctx context.Context, olderThan time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	var n int64
	err := in.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM idem_inbox WHERE rowid IN (
			SELECT rowid FROM idem_inbox WHERE processed_at < ? ORDER BY processed_at LIMIT ?)`,
			olderThan.UnixNano(), limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: purge inbox: %w", err)
	}
	return int(n), nil
}
