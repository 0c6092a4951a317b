package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// OutboxConfig configures NewOutbox. The zero value is ready to use.
type OutboxConfig struct {
	// Clock stamps entries and judges leases. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
}

// Outbox is an idem.Outbox whose entries live in the table idem_outbox of
// a DB, so the service writes them in the transaction of the effect they
// announce. MarkSent deletes entries: once published, the broker has them.
type Outbox struct {
	db    *DB
	clock idem.Clock
}

var _ idem.Outbox = (*Outbox)(nil)

// NewOutbox applies the message tables' migrations to db (component
// "idem_messages") and returns an Outbox on it. cfg may be nil.
func NewOutbox(ctx context.Context, db *DB, cfg *OutboxConfig) (*Outbox, error) {
	var c OutboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Outbox{db: db, clock: c.Clock}, nil
}

// Add implements idem.Outbox: it writes msgs through db.WithTx, so it joins
// the transaction ctx carries. Returns an error matching
// idem.ErrInvalidArgument, having added nothing, when a message does not
// validate.
func (o *Outbox) Add(ctx context.Context, msgs ...idem.Message) error {
	for _, m := range msgs {
		if err := m.Validate(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := o.clock.Now().UnixNano()
	err := o.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, m := range msgs {
			h, err := encodeHeaders(m.Headers)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO idem_outbox
				(id, topic, key, headers, payload, msg_time, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
				m.ID, m.Topic, m.Key, h, payloadArg(m.Payload), msgNanos(m.Time), now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: outbox add: %w", err)
	}
	return nil
}

// Claim implements idem.Outbox. The entries are chosen and leased in one
// write transaction, which the single writer connection (and SQLite's write
// lock, across processes) runs alone, so two relays never lease one entry.
// Returns an error matching idem.ErrInvalidArgument when relay is empty or
// limit or lease is not positive.
func (o *Outbox) Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	switch {
	case relay == "":
		return nil, &idem.ArgumentError{Field: "relay", Reason: "must not be empty"}
	case limit <= 0:
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	case lease <= 0:
		return nil, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	now := o.clock.Now()
	var out []idem.OutboxEntry
	err := o.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT seq, id, topic, key, headers, payload, msg_time, created_at
			FROM idem_outbox WHERE lease_until <= ? ORDER BY seq LIMIT ?`, now.UnixNano(), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				en      idem.OutboxEntry
				h       sql.NullString
				mt, cat int64
			)
			if err := rows.Scan(&en.Seq, &en.Message.ID, &en.Message.Topic, &en.Message.Key, &h, &en.Message.Payload, &mt, &cat); err != nil {
				return err
			}
			if en.Message.Headers, err = decodeHeaders(h); err != nil {
				return err
			}
			en.Message.Time, en.CreatedAt = msgTime(mt), time.Unix(0, cat)
			out = append(out, en)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows.Close()
		if len(out) == 0 {
			return nil
		}
		args := []any{relay, now.Add(lease).UnixNano()}
		for _, en := range out {
			args = append(args, en.Seq)
		}
		_, err = tx.ExecContext(ctx, `UPDATE idem_outbox SET relay = ?, lease_until = ? WHERE seq IN (`+
			placeholders(len(out))+`)`, args...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: outbox claim: %w", err)
	}
	return out, nil
}

// MarkSent implements idem.Outbox: it deletes the entries, in the
// transaction ctx carries if any. Marking an entry already gone does
// nothing, so a retry is safe.
func (o *Outbox) MarkSent(ctx context.Context, seqs ...int64) error {
	if len(seqs) == 0 {
		return nil
	}
	args := make([]any, len(seqs))
	for i, s := range seqs {
		args[i] = s
	}
	err := o.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM idem_outbox WHERE seq IN (`+placeholders(len(seqs))+`)`, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: outbox mark sent: %w", err)
	}
	return nil
}

// placeholders returns "?, ?, …", n of them.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
