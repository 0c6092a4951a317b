package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// Ledger is an idem.Ledger whose attempts, holds and parked messages live
// in the tables idem_ledger_* of a DB. Every method runs through
// db.WithTx, so it joins the transaction ctx carries (the inbox's, or the
// dead letters'), and reads inside one see its own writes; outside one,
// reads go to the read pool.
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
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case key == "":
		return &idem.ArgumentError{Field: keyField, Reason: "must not be empty"}
	}
	return nil
}

// RecordAttempt implements idem.Ledger. Returns an error matching
// idem.ErrInvalidArgument when consumer or dedupKey is empty.
func (l *Ledger) RecordAttempt(ctx context.Context, consumer, dedupKey string, a idem.Attempt) ([]idem.Attempt, error) {
	if err := checkLedger(consumer, "dedupKey", dedupKey); err != nil {
		return nil, err
	}
	var all []idem.Attempt
	err := l.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO idem_ledger_attempts (consumer, dedup_key, ord, number, at, class, error)
			VALUES (?, ?, (SELECT coalesce(max(ord), 0) + 1 FROM idem_ledger_attempts WHERE consumer = ? AND dedup_key = ?), ?, ?, ?, ?)`,
			consumer, dedupKey, consumer, dedupKey, a.Number, msgNanos(a.At), string(a.Class), a.Error); err != nil {
			return err
		}
		var err error
		all, err = ledgerAttempts(ctx, tx, consumer, dedupKey)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: record attempt: %w", err)
	}
	return all, nil
}

// Attempts implements idem.Ledger. Returns nil when none are recorded.
func (l *Ledger) Attempts(ctx context.Context, consumer, dedupKey string) ([]idem.Attempt, error) {
	if err := checkLedger(consumer, "dedupKey", dedupKey); err != nil {
		return nil, err
	}
	var all []idem.Attempt
	err := l.db.read(ctx, func(ctx context.Context, q queryer) error {
		var err error
		all, err = ledgerAttempts(ctx, q, consumer, dedupKey)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: attempts: %w", err)
	}
	return all, nil
}

func ledgerAttempts(ctx context.Context, q queryer, consumer, dedupKey string) ([]idem.Attempt, error) {
	rows, err := q.QueryContext(ctx, `SELECT number, at, class, error FROM idem_ledger_attempts
		WHERE consumer = ? AND dedup_key = ? ORDER BY ord`, consumer, dedupKey)
	if err != nil {
		return nil, err
	}
	return scanAttempts(rows)
}

// scanAttempts reads rows of (number, at, class, error) and closes them.
func scanAttempts(rows *sql.Rows) ([]idem.Attempt, error) {
	defer rows.Close()
	var out []idem.Attempt
	for rows.Next() {
		var (
			a     idem.Attempt
			at    int64
			class string
		)
		if err := rows.Scan(&a.Number, &at, &class, &a.Error); err != nil {
			return nil, err
		}
		a.At, a.Class = msgTime(at), idem.ErrorClass(class)
		out = append(out, a)
	}
	return out, rows.Err()
}

// ForgetAttempts implements idem.Ledger.
func (l *Ledger) ForgetAttempts(ctx context.Context, consumer, dedupKey string) error {
	if err := checkLedger(consumer, "dedupKey", dedupKey); err != nil {
		return err
	}
	err := l.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM idem_ledger_attempts WHERE consumer = ? AND dedup_key = ?`, consumer, dedupKey)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: forget attempts: %w", err)
	}
	return nil
}

// HoldBack implements idem.Ledger. Holding a key held already moves it
// behind letterID. Returns an error matching idem.ErrInvalidArgument when
// an argument is empty.
func (l *Ledger) HoldBack(ctx context.Context, consumer, key, letterID string) error {
	if err := checkLedger(consumer, "key", key); err != nil {
		return err
	}
	if letterID == "" {
		return &idem.ArgumentError{Field: "letterID", Reason: "must not be empty"}
	}
	err := l.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO idem_ledger_holds (consumer, key, letter_id) VALUES (?, ?, ?)
			ON CONFLICT (consumer, key) DO UPDATE SET letter_id = excluded.letter_id`, consumer, key, letterID)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: hold back: %w", err)
	}
	return nil
}

// HeldBack implements idem.Ledger.
func (l *Ledger) HeldBack(ctx context.Context, consumer, key string) (string, bool, error) {
	if err := checkLedger(consumer, "key", key); err != nil {
		return "", false, err
	}
	var id string
	err := l.db.read(ctx, func(ctx context.Context, q queryer) error {
		return q.QueryRowContext(ctx, `SELECT letter_id FROM idem_ledger_holds WHERE consumer = ? AND key = ?`, consumer, key).Scan(&id)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("idemsqlite: held back: %w", err)
	}
	return id, true, nil
}

// Park implements idem.Ledger: m is kept under its own Key. Returns an
// error matching idem.ErrInvalidArgument when consumer is empty or m does
// not validate.
func (l *Ledger) Park(ctx context.Context, consumer string, m idem.Message) error {
	if consumer == "" {
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	}
	if err := m.Validate(); err != nil {
		return err
	}
	h, err := encodeHeaders(m.Headers)
	if err != nil {
		return fmt.Errorf("idemsqlite: park: %w", err)
	}
	err = l.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO idem_ledger_parked (consumer, key, id, topic, headers, payload, msg_time)
			VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, id) DO NOTHING`,
			consumer, m.Key, m.ID, m.Topic, h, payloadArg(m.Payload), msgNanos(m.Time))
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: park: %w", err)
	}
	return nil
}

// LetGo implements idem.Ledger.
func (l *Ledger) LetGo(ctx context.Context, consumer, key string) ([]idem.Message, error) {
	if err := checkLedger(consumer, "key", key); err != nil {
		return nil, err
	}
	var out []idem.Message
	err := l.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id, topic, key, headers, payload, msg_time FROM idem_ledger_parked
			WHERE consumer = ? AND key = ? ORDER BY seq`, consumer, key)
		if err != nil {
			return err
		}
		if out, err = scanMessages(rows); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM idem_ledger_parked WHERE consumer = ? AND key = ?`, consumer, key); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM idem_ledger_holds WHERE consumer = ? AND key = ?`, consumer, key)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: let go: %w", err)
	}
	return out, nil
}

// scanMessages reads rows of (id, topic, key, headers, payload, msg_time)
// and closes them.
func scanMessages(rows *sql.Rows) ([]idem.Message, error) {
	defer rows.Close()
	var out []idem.Message
	for rows.Next() {
		var (
			m  idem.Message
			h  sql.NullString
			mt int64
		)
		if err := rows.Scan(&m.ID, &m.Topic, &m.Key, &h, &m.Payload, &mt); err != nil {
			return nil, err
		}
		var err error
		if m.Headers, err = decodeHeaders(h); err != nil {
			return nil, err
		}
		m.Time = msgTime(mt)
		out = append(out, m)
	}
	return out, rows.Err()
}
