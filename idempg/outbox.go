package idempg

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// OutboxConfig configures NewOutbox. The zero value is ready to use.
type OutboxConfig struct {
	// Clock stamps entries and judges leases. Defaults to the DB's:
	// Config.Clock, or the database's clock when that is nil.
	Clock idem.Clock
}

// Outbox is an idem.Outbox whose entries live in the table idem_outbox of a
// DB's schema, so the service writes them in the transaction of the effect
// they announce. MarkSent deletes entries: once published, the broker has
// them. It is safe for concurrent use, by many goroutines and relays in many
// processes.
type Outbox struct {
	db    *DB
	clock idem.Clock // nil: the DB's
}

var _ idem.Outbox = (*Outbox)(nil)

// NewOutbox applies the message tables' migrations to db (component
// "idem_messages") and returns an Outbox on it. cfg may be nil.
func NewOutbox(ctx context.Context, db *DB, cfg *OutboxConfig) (*Outbox, error) {
	var c OutboxConfig
	if cfg != nil {
		c = *cfg
	}
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Outbox{db: db, clock: c.Clock}, nil
}

// outboxAddSQL adds messages, one per element of the arrays, in the arrays'
// order: ORDER BY makes the identity column number them so.
const outboxAddSQL = `INSERT INTO idem_outbox (` + pgsql.MessageColumns + `, created_at)
	SELECT m.id, m.topic, m.key, m.headers::jsonb, m.headers_base64, m.payload, m.msg_time, n.t
	FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::boolean[], $6::bytea[], $7::timestamptz[])
		WITH ORDINALITY AS m(id, topic, key, headers, headers_base64, payload, msg_time, ord),
		(SELECT coalesce($8::timestamptz, clock_timestamp()) AS t) AS n
	ORDER BY m.ord`

// Add implements idem.Outbox: it writes msgs in one statement, in the
// transaction ctx carries (the caller's own, begun with WithTx, so that the
// messages commit with the effect), or on its own, when ctx carries none.
// Returns an error matching idem.ErrInvalidArgument, having added nothing,
// when a message does not validate or its ID, topic or key is not storable
// as text (not UTF-8, or holding a NUL byte).
func (o *Outbox) Add(ctx context.Context, msgs ...idem.Message) error {
	var (
		ids, topics, keys []string
		headers           []*string
		encoded           []bool
		payloads          [][]byte
		times             []*time.Time
	)
	for _, m := range msgs {
		if err := pgsql.CheckMessage(m); err != nil {
			return err
		}
		h, enc, err := pgsql.HeadersArg(m.Headers)
		if err != nil {
			return fmt.Errorf("idempg: outbox add: %w", err)
		}
		var t *time.Time
		if !m.Time.IsZero() {
			t = &m.Time
		}
		ids, topics, keys = append(ids, m.ID), append(topics, m.Topic), append(keys, m.Key)
		headers, encoded = append(headers, h), append(encoded, enc)
		payloads, times = append(payloads, pgsql.PayloadArg(m.Payload)), append(times, t)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	q, err := o.db.writeQuerier(ctx)
	switch {
	case err != nil:
	case len(msgs) == 1:
		_, err = q.Exec(ctx, pgsql.OutboxAddOne, ids[0], topics[0], keys[0], headers[0], encoded[0], payloads[0], times[0], o.db.storeNow(o.clock))
	default:
		_, err = q.Exec(ctx, outboxAddSQL, ids, topics, keys, headers, encoded, payloads, times, o.db.storeNow(o.clock))
	}
	if err != nil {
		return fmt.Errorf("idempg: outbox add: %w", err)
	}
	return nil
}

// Claim implements idem.Outbox, in one statement (see pgsql.OutboxClaim), in
// the transaction ctx carries if any. The lease is rounded up to whole
// microseconds. Returns an error matching idem.ErrInvalidArgument when relay
// is empty or limit or lease is not positive.
func (o *Outbox) Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	switch {
	case relay == "":
		return nil, &idem.ArgumentError{Field: "relay", Reason: "must not be empty"}
	case limit <= 0:
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	case lease <= 0:
		return nil, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	if err := pgsql.CheckText("relay", relay); err != nil {
		return nil, err
	}
	q, err := o.db.writeQuerier(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempg: outbox claim: %w", err)
	}
	rows, err := q.Query(ctx, pgsql.OutboxClaim, o.db.storeNow(o.clock), int64(limit), relay, pgsql.Micros(lease))
	if err != nil {
		return nil, fmt.Errorf("idempg: outbox claim: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idem.OutboxEntry, error) {
		var (
			en      idem.OutboxEntry
			m       pgsql.MessageRow
			created time.Time
		)
		if err := row.Scan(append(append([]any{&en.Seq}, m.Dest()...), &created)...); err != nil {
			return en, err
		}
		var err error
		en.Message, err = m.Message()
		en.CreatedAt = created.UTC()
		return en, err
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: outbox claim: %w", err)
	}
	// RETURNING follows no order.
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
	q, err := o.db.writeQuerier(ctx)
	if err == nil {
		_, err = q.Exec(ctx, `DELETE FROM idem_outbox WHERE seq = ANY ($1)`, seqs)
	}
	if err != nil {
		return fmt.Errorf("idempg: outbox mark sent: %w", err)
	}
	return nil
}
