package idemsqlite

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
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

// The outbox's statements, prepared once per DB.
var (
	sqlAddOutbox = messagesSQL(`INSERT INTO idem_outbox
		(id, topic, key, headers, payload, msg_time, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`)
	// RETURNING gives the rows in no particular order: Claim sorts them.
	sqlClaimOutbox = messagesSQL(`UPDATE idem_outbox SET relay = ?1, lease_until = ?2
		WHERE seq IN (SELECT seq FROM idem_outbox WHERE lease_until <= ?3 ORDER BY seq LIMIT ?4)
		RETURNING seq, id, topic, key, headers, payload, msg_time, created_at`)
	// The seqs come as a JSON array.
	sqlMarkSent = messagesSQL(`DELETE FROM idem_outbox WHERE seq IN (SELECT value FROM json_each(?))`)
)

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
		add := o.db.in(tx).bind(ctx, sqlAddOutbox)
		for _, m := range msgs {
			h, err := encodeHeaders(m.Headers)
			if err != nil {
				return err
			}
			if _, err := add.exec(ctx, m.ID, m.Topic, m.Key, h, payloadArg(m.Payload), msgNanos(m.Time), now); err != nil {
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

// Claim implements idem.Outbox. The entries are chosen and leased by one
// statement, in a write transaction, which the single writer connection
// (and SQLite's write lock, across processes) runs alone, so two relays
// never lease one entry.
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
		rows, err := o.db.in(tx).query(ctx, sqlClaimOutbox, relay, now.Add(lease).UnixNano(), now.UnixNano(), limit)
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
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: outbox claim: %w", err)
	}
	slices.SortFunc(out, func(a, b idem.OutboxEntry) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// MarkSent implements idem.Outbox: it deletes the entries, in the
// transaction ctx carries if any. Marking an entry already gone does
// nothing, so a retry is safe.
func (o *Outbox) MarkSent(ctx context.Context, seqs ...int64) error {
	if len(seqs) == 0 {
		return nil
	}
	err := o.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := o.db.in(tx).exec(ctx, sqlMarkSent, jsonInts(seqs))
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: outbox mark sent: %w", err)
	}
	return nil
}
