package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// Ledger is an idem.Ledger whose attempts, holds and parked messages live
// in the tables idem_ledger_* of a DB's schema. Each method is one
// statement. Writes join the transaction ctx carries (the inbox's, or the
// dead letters'), or commit on their own; reads run in that transaction
// once it has begun, so they see its writes, and on the pool otherwise. It
// is safe for concurrent use.
//
// Error texts are stored as text: bytes that are not UTF-8, and NUL bytes,
// become U+FFFD. Times are kept to the microsecond.
type Ledger struct {
	db *DB
}

var _ idem.Ledger = (*Ledger)(nil)

// NewLedger applies the message tables' migrations to db (component
// "idem_messages") and returns a Ledger on it.
func NewLedger(ctx context.Context, db *DB) (*Ledger, error) {
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Ledger{db: db}, nil
}

func checkLedger(consumer, keyField, key string) error {
	if err := pgsql.CheckName("consumer", consumer); err != nil {
		return err
	}
	return pgsql.CheckName(keyField, key)
}

// recordAttemptSQL appends an attempt and returns every attempt of the
// message, oldest first. The SELECT sees the table as of the statement's
// start, without the new row, which the INSERT returns: UNION ALL joins
// them.
const recordAttemptSQL = `WITH ins AS (
	INSERT INTO idem_ledger_attempts (consumer, dedup_key, number, at, class, error)
	VALUES ($1, $2, $3, $4, $5, $6)
	RETURNING seq, number, at, class, error)
SELECT number, at, class, error FROM (
	SELECT seq, number, at, class, error FROM idem_ledger_attempts WHERE consumer = $1 AND dedup_key = $2
	UNION ALL
	SELECT seq, number, at, class, error FROM ins) AS a
ORDER BY seq`

// RecordAttempt implements idem.Ledger. Returns an error matching
// idem.ErrInvalidArgument when consumer or dedupKey is empty or not
// storable as text (not UTF-8, or holding a NUL byte).
func (l *Ledger) RecordAttempt(ctx context.Context, consumer, dedupKey string, a idem.Attempt) ([]idem.Attempt, error) {
	if err := checkLedger(consumer, "dedupKey", dedupKey); err != nil {
		return nil, err
	}
	q, err := l.db.writeQuerier(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempg: record attempt: %w", err)
	}
	rows, err := q.Query(ctx, recordAttemptSQL, consumer, dedupKey, int32(a.Number), pgsql.TimeArg(a.At),
		freeText(string(a.Class)), freeText(a.Error))
	if err != nil {
		return nil, fmt.Errorf("idempg: record attempt: %w", err)
	}
	all, err := collectAttempts(rows)
	if err != nil {
		return nil, fmt.Errorf("idempg: record attempt: %w", err)
	}
	return all, nil
}

// Attempts implements idem.Ledger. Returns nil when none are recorded.
func (l *Ledger) Attempts(ctx context.Context, consumer, dedupKey string) ([]idem.Attempt, error) {
	if err := checkLedger(consumer, "dedupKey", dedupKey); err != nil {
		return nil, err
	}
	rows, err := l.db.readQuerier(ctx).Query(ctx, `SELECT number, at, class, error FROM idem_ledger_attempts
		WHERE consumer = $1 AND dedup_key = $2 ORDER BY seq`, consumer, dedupKey)
	if err != nil {
		return nil, fmt.Errorf("idempg: attempts: %w", err)
	}
	all, err := collectAttempts(rows)
	if err != nil {
		return nil, fmt.Errorf("idempg: attempts: %w", err)
	}
	return all, nil
}

// collectAttempts reads rows of (number, at, class, error); nil when there
// are none.
func collectAttempts(rows pgx.Rows) ([]idem.Attempt, error) {
	var out []idem.Attempt
	var (
		a     idem.Attempt
		at    *time.Time
		class string
	)
	_, err := pgx.ForEachRow(rows, []any{&a.Number, &at, &class, &a.Error}, func() error {
		out = append(out, idem.Attempt{Number: a.Number, At: pgsql.TimeOf(at), Class: idem.ErrorClass(class), Error: a.Error})
		return nil
	})
	return out, err
}

// ForgetAttempts implements idem.Ledger.
func (l *Ledger) ForgetAttempts(ctx context.Context, consumer, dedupKey string) error {
	if err := checkLedger(consumer, "dedupKey", dedupKey); err != nil {
		return err
	}
	q, err := l.db.writeQuerier(ctx)
	if err == nil {
		_, err = q.Exec(ctx, `DELETE FROM idem_ledger_attempts WHERE consumer = $1 AND dedup_key = $2`, consumer, dedupKey)
	}
	if err != nil {
		return fmt.Errorf("idempg: forget attempts: %w", err)
	}
	return nil
}

// HoldBack implements idem.Ledger. Holding a key held already moves it
// behind letterID. Returns an error matching idem.ErrInvalidArgument when
// an argument is empty or not storable as text.
func (l *Ledger) HoldBack(ctx context.Context, consumer, key, letterID string) error {
	if err := checkLedger(consumer, "key", key); err != nil {
		return err
	}
	if err := pgsql.CheckName("letterID", letterID); err != nil {
		return err
	}
	q, err := l.db.writeQuerier(ctx)
	if err == nil {
		_, err = q.Exec(ctx, `INSERT INTO idem_ledger_holds (consumer, key, letter_id) VALUES ($1, $2, $3)
			ON CONFLICT (consumer, key) DO UPDATE SET letter_id = excluded.letter_id`, consumer, key, letterID)
	}
	if err != nil {
		return fmt.Errorf("idempg: hold back: %w", err)
	}
	return nil
}

// HeldBack implements idem.Ledger.
func (l *Ledger) HeldBack(ctx context.Context, consumer, key string) (string, bool, error) {
	if err := checkLedger(consumer, "key", key); err != nil {
		return "", false, err
	}
	// In a transaction the hold is read FOR SHARE: a Park that follows in
	// the same transaction then cannot interleave with a LetGo, which
	// deletes the hold first and so waits for this transaction, or makes
	// this read wait and find the hold gone. Without the lock a message
	// could be parked behind a hold LetGo had already cleared, and stay
	// parked for good.
	q, err := l.db.writeQuerier(ctx)
	if err != nil {
		return "", false, fmt.Errorf("idempg: held back: %w", err)
	}
	lock := ""
	if l.db.carried(ctx) != nil {
		lock = " FOR SHARE"
	}
	var id string
	err = q.QueryRow(ctx, `SELECT letter_id FROM idem_ledger_holds WHERE consumer = $1 AND key = $2`+lock,
		consumer, key).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("idempg: held back: %w", err)
	}
	return id, true, nil
}

// HeldBackKeys implements idem.BatchLedger in one statement, reading the
// holds FOR SHARE in a transaction for the reason HeldBack does.
func (l *Ledger) HeldBackKeys(ctx context.Context, consumer string, keys []string) (map[string]string, error) {
	for _, k := range keys {
		if err := checkLedger(consumer, "key", k); err != nil {
			return nil, err
		}
	}
	if err := pgsql.CheckName("consumer", consumer); err != nil {
		return nil, err
	}
	held := make(map[string]string)
	if len(keys) == 0 {
		return held, nil
	}
	q, err := l.db.writeQuerier(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempg: held back: %w", err)
	}
	lock := ""
	if l.db.carried(ctx) != nil {
		lock = " FOR SHARE"
	}
	rows, err := q.Query(ctx, `SELECT key, letter_id FROM idem_ledger_holds WHERE consumer = $1 AND key = ANY($2::text[])`+lock,
		consumer, keys)
	if err != nil {
		return nil, fmt.Errorf("idempg: held back: %w", err)
	}
	var k, id string
	if _, err := pgx.ForEachRow(rows, []any{&k, &id}, func() error {
		held[k] = id
		return nil
	}); err != nil {
		return nil, fmt.Errorf("idempg: held back: %w", err)
	}
	return held, nil
}

// Park implements idem.Ledger: m is kept under its own Key. Returns an
// error matching idem.ErrInvalidArgument when consumer is empty, m does not
// validate, or a name is not storable as text.
func (l *Ledger) Park(ctx context.Context, consumer string, m idem.Message) error {
	if err := pgsql.CheckName("consumer", consumer); err != nil {
		return err
	}
	if err := pgsql.CheckMessage(m); err != nil {
		return err
	}
	args, err := pgsql.MessageArgs(m)
	if err != nil {
		return fmt.Errorf("idempg: park: %w", err)
	}
	q, err := l.db.writeQuerier(ctx)
	if err == nil {
		_, err = q.Exec(ctx, `INSERT INTO idem_ledger_parked (consumer, `+pgsql.MessageColumns+`)
			VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8) ON CONFLICT (consumer, id) DO NOTHING`,
			append([]any{consumer}, args...)...)
	}
	if err != nil {
		return fmt.Errorf("idempg: park: %w", err)
	}
	return nil
}

// LetGo's two statements. The hold goes first, in a statement of its own:
// it waits for any transaction that read the hold FOR SHARE (HeldBack) and
// may be parking behind it, and the second statement, which takes a new
// snapshot at READ COMMITTED, then sees what that transaction parked.
// One statement with both deletes would share one snapshot and miss it.
const (
	letGoHoldSQL   = `DELETE FROM idem_ledger_holds WHERE consumer = $1 AND key = $2`
	letGoParkedSQL = `WITH parked AS (
	DELETE FROM idem_ledger_parked WHERE consumer = $1 AND key = $2
	RETURNING seq, ` + pgsql.MessageColumns + `)
SELECT ` + pgsql.MessageColumns + ` FROM parked ORDER BY seq`
)

// LetGo implements idem.Ledger, in the transaction ctx carries or in one of
// its own. It relies on READ COMMITTED, idempg's default: at REPEATABLE
// READ its second statement would read the transaction's first snapshot and
// could miss a message parked concurrently.
func (l *Ledger) LetGo(ctx context.Context, consumer, key string) ([]idem.Message, error) {
	if err := checkLedger(consumer, "key", key); err != nil {
		return nil, err
	}
	var out []idem.Message
	err := l.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		out = nil
		if _, err := tx.Exec(ctx, letGoHoldSQL, consumer, key); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, letGoParkedSQL, consumer, key)
		if err != nil {
			return err
		}
		var m pgsql.MessageRow
		_, err = pgx.ForEachRow(rows, m.Dest(), func() error {
			msg, err := m.Message()
			out = append(out, msg)
			return err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: let go: %w", err)
	}
	return out, nil
}
