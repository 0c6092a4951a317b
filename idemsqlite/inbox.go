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
// the record of its message commit in one transaction. It is also an
// idem.SequenceInbox, whose marks live in the table idem_inbox_sequences,
// one row per (consumer, aggregate).
type Inbox struct {
	db    *DB
	clock idem.Clock
}

var (
	_ idem.Inbox         = (*Inbox)(nil)
	_ idem.BatchInbox    = (*Inbox)(nil)
	_ idem.SequenceInbox = (*Inbox)(nil)
)

// The inbox's statements, prepared once per DB.
var (
	sqlRecordInbox = messagesSQL(`INSERT INTO idem_inbox (consumer, dedup_key, processed_at) VALUES (?, ?, ?)
		ON CONFLICT DO NOTHING`)
	// The keys come as a JSON array of hex (see jsonHex); the rows
	// returned are the keys recorded now. (WHERE true tells SQLite's
	// parser that ON CONFLICT is not a join's ON.)
	sqlRecordInboxBatch = messagesSQL(`INSERT INTO idem_inbox (consumer, dedup_key, processed_at)
		SELECT ?1, CAST(unhex(value) AS TEXT), ?2 FROM json_each(?3) WHERE true
		ON CONFLICT DO NOTHING RETURNING dedup_key`)
	// Marks hold the uint64's bits in SQLite's signed INTEGER; they are
	// compared in Go, never in SQL.
	sqlReadMark  = messagesSQL(`SELECT mark FROM idem_inbox_sequences WHERE consumer = ? AND aggregate = ?`)
	sqlRaiseMark = messagesSQL(`INSERT INTO idem_inbox_sequences (consumer, aggregate, mark, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (consumer, aggregate) DO UPDATE SET mark = excluded.mark, updated_at = excluded.updated_at`)
	sqlPurgeInbox = messagesSQL(`DELETE FROM idem_inbox WHERE rowid IN (
		SELECT rowid FROM idem_inbox WHERE processed_at < ? ORDER BY processed_at LIMIT ?)`)
)

// NewInbox applies the message tables' migrations to db (component
// "idem_messages") and returns an Inbox on it.
func NewInbox(ctx context.Context, db *DB) (*Inbox, error) {
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Inbox{db: db, clock: idem.SystemClock{}}, nil
}

// Process implements idem.Inbox. It runs in db.WithTx: in the transaction
// ctx carries, or in one of its own. Inside it, it inserts the (consumer,
// dedupKey) row unless there is one, returns idem.ErrDuplicate if there
// was, and otherwise runs fn. The single writer connection makes the look
// and the insert one atomic step for every goroutine and, through SQLite's
// write lock, every process.
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
		res, err := in.db.in(tx).exec(ctx, sqlRecordInbox, consumer, dedupKey, in.clock.Now().UnixNano())
		if err != nil {
			return fmt.Errorf("idemsqlite: inbox: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("idemsqlite: inbox: %w", err)
		} else if n == 0 {
			return idem.ErrDuplicate
		}
		return fn(ctx)
	})
	return wrapTx("inbox", err)
}

// ProcessSequence implements idem.SequenceInbox. Like Process, it runs in
// db.WithTx, in the transaction ctx carries or one of its own; there it
// reads the mark of (consumer, aggregate) (0 when it has no row), returns
// idem.ErrDuplicate or an *idem.SequenceGapError when seq is one, and
// otherwise runs fn and then writes seq as the new mark. The single writer
// connection makes the read, fn and the write one step for the whole
// process, and SQLite's write lock, taken when the transaction begins
// (BEGIN IMMEDIATE), for every process, so two calls of one aggregate never
// read the same mark.
//
// When fn fails, ProcessSequence rolls back its own transaction and returns
// fn's error unchanged. In a joined transaction the mark is written only
// after fn succeeded, so a failed fn leaves it as it was even if the caller
// commits; fn's own writes are the caller's to roll back. Marks are never
// purged (PurgeInbox deletes idem_inbox rows only).
//
// Returns an error matching idem.ErrInvalidArgument, having changed
// nothing, for the arguments idem.CheckSequenceArgs refuses. On a failure to
// commit, the mark and fn's writes may or may not have been committed: a
// redelivery finds out.
func (in *Inbox) ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(ctx context.Context) error) error {
	if err := idem.CheckSequenceArgs(consumer, aggregate, seq, gap, fn); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := in.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		r := in.db.in(tx)
		var stored int64
		switch err := r.queryRow(ctx, sqlReadMark, consumer, aggregate).Scan(&stored); {
		case errors.Is(err, sql.ErrNoRows):
			stored = 0
		case err != nil:
			return fmt.Errorf("idemsqlite: inbox: read the mark: %w", err)
		}
		if err := idem.CheckSequence(aggregate, uint64(stored), seq, gap); err != nil {
			return err
		}
		if err := fn(ctx); err != nil {
			return err
		}
		if _, err := r.exec(ctx, sqlRaiseMark, consumer, aggregate, int64(seq), in.clock.Now().UnixNano()); err != nil {
			return fmt.Errorf("idemsqlite: inbox: raise the mark: %w", err)
		}
		return nil
	})
	return wrapTx("inbox", err)
}

// ProcessBatch implements idem.BatchInbox. Like Process, it runs in
// db.WithTx, in the transaction ctx carries or one of its own; there, one
// statement inserts the rows of the keys not recorded yet and tells which
// those are, and then fn runs with the transaction in its context. When fn
// fails, ProcessBatch rolls back its own transaction and returns fn's error
// unchanged; a joined transaction's rollback is its owner's to do.
//
// Returns an error matching idem.ErrInvalidArgument, having recorded
// nothing, when consumer or a key is empty, a key is repeated, or fn is
// nil.
func (in *Inbox) ProcessBatch(ctx context.Context, consumer string, dedupKeys []string, fn func(ctx context.Context, fresh []bool) error) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case fn == nil:
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	index := make(map[string]int, len(dedupKeys))
	for i, k := range dedupKeys {
		if k == "" {
			return &idem.ArgumentError{Field: "dedupKeys", Reason: fmt.Sprintf("key %d is empty", i)}
		}
		if j, dup := index[k]; dup {
			return &idem.ArgumentError{Field: "dedupKeys", Reason: fmt.Sprintf("keys %d and %d are both %q", j, i, k)}
		}
		index[k] = i
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := in.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		fresh := make([]bool, len(dedupKeys))
		if len(dedupKeys) > 0 {
			if err := in.recordBatch(ctx, tx, consumer, dedupKeys, index, fresh); err != nil {
				return fmt.Errorf("idemsqlite: inbox: %w", err)
			}
		}
		return fn(ctx, fresh)
	})
	return wrapTx("inbox", err)
}

// recordBatch inserts the rows of keys not recorded yet, and sets fresh[i]
// for each key keys[i] recorded now; index maps each key to its i.
func (in *Inbox) recordBatch(ctx context.Context, tx *sql.Tx, consumer string, keys []string, index map[string]int, fresh []bool) error {
	rows, err := in.db.in(tx).query(ctx, sqlRecordInboxBatch, consumer, in.clock.Now().UnixNano(), jsonHex(keys))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return err
		}
		i, ok := index[k]
		if !ok {
			return fmt.Errorf("recorded a key %q that is not in the batch", k)
		}
		fresh[i] = true
	}
	// The deferred Close runs before fn does (the transaction's connection
	// serves one statement at a time); what is left to report is why the
	// rows stopped.
	return rows.Err()
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
		res, err := in.db.in(tx).exec(ctx, sqlPurgeInbox, olderThan.UnixNano(), limit)
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
