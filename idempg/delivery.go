package idempg

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

type pgDelivery struct {
	s       *pgStream
	seq     int64
	token   int64
	attempt int
	msg     idem.Message
}

// Message implements idem.Delivery.
func (d *pgDelivery) Message() idem.Message { return d.msg }

// Attempt implements idem.Delivery: the stored count of hand-outs of the
// message to the consumer name.
func (d *pgDelivery) Attempt() int { return d.attempt }

// The statements of a delivery's methods change its queue row only while
// the delivery holds it. $5 turns synchronous_commit off when the statement
// commits on its own (see Transport, "Transactions").
const (
	ackSQL = `WITH n AS MATERIALIZED (
	SELECT CASE WHEN $5::boolean THEN set_config('synchronous_commit', 'off', true) END AS async)
DELETE FROM idem_transport_pending AS p USING n
	WHERE p.consumer_id = $1 AND p.seq = $2 AND p.owner = $3 AND p.owner_token = $4`

	nackSQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($6::timestamptz, clock_timestamp()) AS t,
		CASE WHEN $5::boolean THEN set_config('synchronous_commit', 'off', true) END AS async)
UPDATE idem_transport_pending AS p
	SET visible_at = n.t + $7::bigint * interval '1 microsecond', owner = NULL, owner_token = NULL
	FROM n
	WHERE p.consumer_id = $1 AND p.seq = $2 AND p.owner = $3 AND p.owner_token = $4`

	inProgressSQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($6::timestamptz, clock_timestamp()) AS t,
		CASE WHEN $5::boolean THEN set_config('synchronous_commit', 'off', true) END AS async)
UPDATE idem_transport_pending AS p
	SET visible_at = n.t + $7::bigint * interval '1 microsecond'
	FROM n
	WHERE p.consumer_id = $1 AND p.seq = $2 AND p.owner = $3 AND p.owner_token = $4 AND p.visible_at > n.t`
)

// Ack implements idem.Delivery, in the transaction ctx carries if any.
func (d *pgDelivery) Ack(ctx context.Context) error {
	return d.update(ctx, "ack", true, d.s.t.sql.ack)
}

// Term implements idem.Delivery, in the transaction ctx carries if any.
func (d *pgDelivery) Term(ctx context.Context) error {
	return d.update(ctx, "term", true, d.s.t.sql.ack)
}

// Nack implements idem.Delivery, in the transaction ctx carries if any. A
// negative delay is refused (idem.ValidateNackDelay).
func (d *pgDelivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := idem.ValidateNackDelay(delay); err != nil {
		return err
	}
	return d.update(ctx, "nack", true, d.s.t.sql.nack, d.s.t.now(), pgsql.Micros(delay))
}

// InProgress implements idem.Delivery, in the transaction ctx carries if
// any: the delivery's AckWait starts again. Returns ErrStaleDelivery once
// the AckWait has ended.
func (d *pgDelivery) InProgress(ctx context.Context) error {
	return d.update(ctx, "in progress", false, d.s.t.sql.inProgress, d.s.t.now(), pgsql.Micros(d.s.sub.AckWait))
}

// update runs stmt on the delivery's queue row. settles says the delivery
// is done with when stmt changed the row.
func (d *pgDelivery) update(ctx context.Context, op string, settles bool, stmt string, extra ...any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := d.s.t
	if t.isClosed() {
		return fmt.Errorf("idempg: %s: %w", op, idem.ErrClosed)
	}
	st, err := t.carried(ctx)
	if err != nil {
		return fmt.Errorf("idempg: %s: %w", op, err)
	}
	var q querier = t.db.pool
	if st != nil {
		q = st.tx
	}
	args := append([]any{d.s.consumerID, d.seq, d.s.id, d.token, st == nil}, extra...)
	tag, err := q.Exec(ctx, stmt, args...)
	if err != nil {
		return fmt.Errorf("idempg: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		d.s.forget(d.seq, d.token)
		return fmt.Errorf("idempg: %s: message %q: %w", op, d.msg.ID, ErrStaleDelivery)
	}
	if settles {
		// In the caller's transaction, before it commits: should it roll
		// back, the delivery still holds the message, and the stream's
		// Close leaves it to its AckWait.
		d.s.forget(d.seq, d.token)
		// A stream of this process at MaxInFlight, or waiting for a
		// message given back by Nack, looks again.
		t.waits.wake(d.s.wakeID)
	}
	return nil
}
