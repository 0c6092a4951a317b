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

var (
	_ idem.Ledger      = (*Ledger)(nil)
	_ idem.BatchLedger = (*Ledger)(nil)
)

// The ledger's statements, prepared once per DB.
var (
	sqlRecordAttempt = messagesSQL(`INSERT INTO idem_ledger_attempts (consumer, dedup_key, ord, number, at, class, error)
		VALUES (?1, ?2, (SELECT coalesce(max(ord), 0) + 1 FROM idem_ledger_attempts WHERE consumer = ?1 AND dedup_key = ?2), ?3, ?4, ?5, ?6)`)
	sqlAttempts = messagesSQL(`SELECT number, at, class, error FROM idem_ledger_attempts
		WHERE consumer = ? AND dedup_key = ? ORDER BY ord`)
	sqlForgetAttempts = messagesSQL(`DELETE FROM idem_ledger_attempts WHERE consumer = ? AND dedup_key = ?`)
	sqlHoldBack       = messagesSQL(`INSERT INTO idem_ledger_holds (consumer, key, letter_id) VALUES (?, ?, ?)
		ON CONFLICT (consumer, key) DO UPDATE SET letter_id = excluded.letter_id`)
	sqlHeldBack = messagesSQL(`SELECT letter_id FROM idem_ledger_holds WHERE consumer = ? AND key = ?`)
	// The keys come as a JSON array of hex (see jsonHex).
	sqlHeldBackKeys = messagesSQL(`SELECT key, letter_id FROM idem_ledger_holds
		WHERE consumer = ? AND key IN (SELECT CAST(unhex(value) AS TEXT) FROM json_each(?))`)
	sqlPark = messagesSQL(`INSERT INTO idem_ledger_parked (consumer, key, id, topic, headers, payload, msg_time)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (consumer, id) DO NOTHING`)
	sqlParked = messagesSQL(`SELECT id, topic, key, headers, payload, msg_time FROM idem_ledger_parked
		WHERE consumer = ? AND key = ? ORDER BY seq`)
	sqlUnpark = messagesSQL(`DELETE FROM idem_ledger_parked WHERE consumer = ? AND key = ?`)
	sqlLetGo  = messagesSQL(`DELETE FROM idem_ledger_holds WHERE consumer = ? AND key = ?`)
)

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
		r := l.db.in(tx)
		if _, err := r.exec(ctx, sqlRecordAttempt,
			consumer, dedupKey, a.Number, msgNanos(a.At), string(a.Class), a.Error); err != nil {
			return err
		}
		var err error
		all, err = ledgerAttempts(ctx, r, consumer, dedupKey)
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
	err := l.db.read(ctx, func(ctx context.Context, r runner) error {
		var err error
		all, err = ledgerAttempts(ctx, r, consumer, dedupKey)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: attempts: %w", err)
	}
	return all, nil
}

func ledgerAttempts(ctx context.Context, r runner, consumer, dedupKey string) ([]idem.Attempt, error) {
	rows, err := r.query(ctx, sqlAttempts, consumer, dedupKey)
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
		_, err := l.db.in(tx).exec(ctx, sqlForgetAttempts, consumer, dedupKey)
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
		_, err := l.db.in(tx).exec(ctx, sqlHoldBack, consumer, key, letterID)
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
	err := l.db.read(ctx, func(ctx context.Context, r runner) error {
		return r.queryRow(ctx, sqlHeldBack, consumer, key).Scan(&id)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("idemsqlite: held back: %w", err)
	}
	return id, true, nil
}

// HeldBackKeys implements idem.BatchLedger, with one statement. Like
// HeldBack, it reads in the transaction ctx carries, or else on the read
// pool. Returns an error matching idem.ErrInvalidArgument when consumer or
// a key is empty.
func (l *Ledger) HeldBackKeys(ctx context.Context, consumer string, keys []string) (map[string]string, error) {
	if consumer == "" {
		return nil, &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	}
	for _, k := range keys {
		if err := checkLedger(consumer, "keys", k); err != nil {
			return nil, err
		}
	}
	held := make(map[string]string)
	if len(keys) == 0 {
		return held, nil
	}
	err := l.db.read(ctx, func(ctx context.Context, r runner) error {
		rows, err := r.query(ctx, sqlHeldBackKeys, consumer, jsonHex(keys))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k, id string
			if err := rows.Scan(&k, &id); err != nil {
				return err
			}
			held[k] = id
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: held back keys: %w", err)
	}
	return held, nil
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
		_, err := l.db.in(tx).exec(ctx, sqlPark, consumer, m.Key, m.ID, m.Topic, h, payloadArg(m.Payload), msgNanos(m.Time))
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
		r := l.db.in(tx)
		rows, err := r.query(ctx, sqlParked, consumer, key)
		if err != nil {
			return err
		}
		if out, err = scanMessages(rows); err != nil {
			return err
		}
		if _, err := r.exec(ctx, sqlUnpark, consumer, key); err != nil {
			return err
		}
		_, err = r.exec(ctx, sqlLetGo, consumer, key)
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
