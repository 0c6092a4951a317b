package idempgsql

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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
// processes, and its entries are idempg's: a relay on idempg's Outbox (or
// its Transport's MoveOutbox) publishes what this one added.
type Outbox struct {
	db    *DB
	clock idem.Clock // nil: the DB's
}

var _ idem.Outbox = (*Outbox)(nil)

// NewOutbox applies the message tables' migrations to db (component
// "idem_messages", shared with idempg) and returns an Outbox on it. cfg
// may be nil.
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

// now is the time parameter of the outbox's statements.
func (o *Outbox) now() any {
	if o.clock != nil {
		return o.clock.Now()
	}
	return o.db.now()
}

// Add implements idem.Outbox: it writes msgs in the transaction ctx
// carries (the caller's own, begun with WithTx or joined with JoinTx, so
// that the messages commit with the effect), inside a savepoint of its
// own, so that a failure adds none of them and leaves the transaction
// usable; or in one of its own when ctx carries none. Entries are numbered
// in msgs' order. Returns an error
// matching idem.ErrInvalidArgument, having added nothing, when a message
// does not validate or its ID, topic or key is not storable as text (not
// UTF-8, or holding a NUL byte).
func (o *Outbox) Add(ctx context.Context, msgs ...idem.Message) error {
	rows := make([][]any, 0, len(msgs))
	for _, m := range msgs {
		if err := pgsql.CheckMessage(m); err != nil {
			return err
		}
		args, err := pgsql.MessageArgs(m)
		if err != nil {
			return fmt.Errorf("idempgsql: outbox add: %w", err)
		}
		rows = append(rows, args)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(rows) == 0 {
		return nil
	}
	now := o.now()
	add := func(ctx context.Context, q querier) error {
		for _, args := range rows {
			if _, err := q.ExecContext(ctx, pgsql.OutboxAddOne, append(args, now)...); err != nil {
				return err
			}
		}
		return nil
	}
	var err error
	switch {
	case o.db.carried(ctx) != nil:
		err = o.db.statement(ctx, "Outbox.Add", func(ctx context.Context, q querier, _ *txState) error { return add(ctx, q) })
	case len(rows) == 1:
		// One statement commits on its own.
		err = add(ctx, o.db.sql)
	default:
		err = o.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return add(ctx, tx) })
	}
	if err != nil {
		return fmt.Errorf("idempgsql: outbox add: %w", err)
	}
	return nil
}

// Claim implements idem.Outbox, in one statement that leases up to limit
// entries whose lease has ended (or that never had one), oldest first,
// passing over the rows a concurrent Claim is leasing (FOR UPDATE SKIP
// LOCKED), in the transaction ctx carries if any. The lease is rounded up
// to whole microseconds. Returns an error matching idem.ErrInvalidArgument
// when relay is empty or limit or lease is not positive.
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
	out, err := o.claim(ctx, relay, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("idempgsql: outbox claim: %w", err)
	}
	// RETURNING follows no order.
	slices.SortFunc(out, func(a, b idem.OutboxEntry) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

func (o *Outbox) claim(ctx context.Context, relay string, limit int, lease time.Duration) (out []idem.OutboxEntry, err error) {
	err = o.db.statement(ctx, "Outbox.Claim", func(ctx context.Context, q querier, _ *txState) error {
		out, err = o.lease(ctx, q, relay, limit, lease)
		return err
	})
	return out, err
}

// lease runs the statement of Claim on q.
func (o *Outbox) lease(ctx context.Context, q querier, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	rows, err := q.QueryContext(ctx, pgsql.OutboxClaim, o.now(), int64(limit), relay, pgsql.Micros(lease))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []idem.OutboxEntry
	for rows.Next() {
		var (
			en      idem.OutboxEntry
			m       pgsql.MessageRow
			created time.Time
		)
		if err := rows.Scan(append(append([]any{&en.Seq}, m.Dest()...), &created)...); err != nil {
			return nil, err
		}
		if en.Message, err = m.Message(); err != nil {
			return nil, err
		}
		en.CreatedAt = created.UTC()
		out = append(out, en)
	}
	return out, rows.Err()
}

// markSentSQL deletes the entries whose numbers $1 lists, comma-separated:
// a text parameter, which every driver sends alike, where an array
// parameter would need the driver's own array type.
const markSentSQL = `DELETE FROM idem_outbox WHERE seq = ANY (string_to_array($1::text, ',')::bigint[])`

// MarkSent implements idem.Outbox: it deletes the entries, in the
// transaction ctx carries if any. Marking an entry already gone does
// nothing, so a retry is safe.
func (o *Outbox) MarkSent(ctx context.Context, seqs ...int64) error {
	if len(seqs) == 0 {
		return nil
	}
	list := make([]string, len(seqs))
	for i, s := range seqs {
		list[i] = strconv.FormatInt(s, 10)
	}
	err := o.db.statement(ctx, "Outbox.MarkSent", func(ctx context.Context, q querier, _ *txState) error {
		_, err := q.ExecContext(ctx, markSentSQL, strings.Join(list, ","))
		return err
	})
	if err != nil {
		return fmt.Errorf("idempgsql: outbox mark sent: %w", err)
	}
	return nil
}
