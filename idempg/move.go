package idempg

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

var _ idem.OutboxMover = (*Transport)(nil)

// moveLockSQL lists, outside any transaction, up to $2 of the oldest outbox
// entries no relay holds under a live lease: the candidates of a move, and
// their topics. An idle relay's look at the outbox is this one statement.
const moveLockSQL = `SELECT o.seq, o.topic FROM idem_outbox AS o,
	(SELECT coalesce($1::timestamptz, clock_timestamp()) AS t) AS n
	WHERE o.lease_until IS NULL OR o.lease_until <= n.t
	ORDER BY o.seq LIMIT $2`

// moveSQL moves the candidates $2 that are still unsent, unleased and not
// being moved by another transaction (SKIP LOCKED) from the outbox to the
// log, in the outbox's order, and queues them for every consumer name of
// their topic, as publishSQL does. It runs after lockTopicsSQL, as a
// statement of its own, for the reason publishSQL does. $3 is the outbox's
// time, which judges leases; $1 the transport's, which stamps the log.
//
// The move commits with synchronous_commit off: a move lost to a server
// crash takes its deletes with its inserts, so the entries are back in the
// outbox to be moved again, and nothing can have consumed them meanwhile,
// since a consumer's commit is durable only once the WAL before it is,
// the move's included.
const moveSQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($1::timestamptz, clock_timestamp()) AS t,
		set_config('synchronous_commit', 'off', true) AS async),
o AS (
	DELETE FROM idem_outbox AS o
	WHERE o.seq IN (
		SELECT c.seq FROM idem_outbox AS c
		WHERE c.seq = ANY($2::bigint[])
		  AND (c.lease_until IS NULL OR c.lease_until <= coalesce($3::timestamptz, clock_timestamp()))
		FOR UPDATE SKIP LOCKED)
	RETURNING o.seq, o.id, o.topic, o.key, o.headers, o.headers_base64, o.payload, o.msg_time),
m AS (
	INSERT INTO idem_transport_messages (topic, id, key, headers, headers_base64, payload, msg_time, published_at)
	SELECT o.topic, o.id, o.key, o.headers, o.headers_base64, o.payload, coalesce(o.msg_time, n.t), n.t
	FROM o, n
	ORDER BY o.seq
	RETURNING seq, topic),
q AS (
	INSERT INTO idem_transport_pending (consumer_id, seq)
	SELECT c.id, m.seq FROM m JOIN idem_transport_consumers AS c ON c.topic = m.topic)
SELECT count(*) FROM m`

// MoveOutbox implements idem.OutboxMover for an *Outbox on the Transport's
// DB: the entries go from the outbox's table to the transport's log and
// queues in one transaction of their own (whatever ctx carries), which
// commits without waiting for the WAL flush (see moveSQL), so that each is
// published exactly once, also across a crash, and no relay holds a lease
// for it meanwhile. It costs two round
// trips: a look at the outbox outside any transaction (all an idle outbox
// costs), then the move, its commit and its notification in one pipeline.
//
// Entries of one topic are moved in the outbox's order. Several movers at
// once move disjoint entries (SKIP LOCKED), so, as with several relays,
// their batches may interleave. Returns ok false for any other outbox, and
// an error matching idem.ErrInvalidArgument when limit is below 1.
func (t *Transport) MoveOutbox(ctx context.Context, ob idem.Outbox, limit int) (int, bool, error) {
	o, isPG := ob.(*Outbox)
	if !isPG || o.db != t.db {
		return 0, false, nil
	}
	if limit < 1 {
		return 0, true, &idem.ArgumentError{Field: "limit", Reason: "must be at least 1"}
	}
	if err := ctx.Err(); err != nil {
		return 0, true, err
	}
	if t.isClosed() {
		return 0, true, idem.ErrClosed
	}
	rows, err := t.db.pool.Query(ctx, t.sql.moveLock, t.db.storeNow(o.clock), int64(limit))
	if err != nil {
		return 0, true, fmt.Errorf("idempg: move outbox: %w", err)
	}
	var seqs []int64
	var topics []string
	var seq int64
	var topic string
	if _, err := pgx.ForEachRow(rows, []any{&seq, &topic}, func() error {
		seqs, topics = append(seqs, seq), append(topics, topic)
		return nil
	}); err != nil {
		return 0, true, fmt.Errorf("idempg: move outbox: %w", err)
	}
	if len(seqs) == 0 {
		return 0, true, nil
	}
	slices.Sort(topics)
	topics = slices.Compact(topics)
	wakes := make([]string, len(topics))
	for i, topic := range topics {
		wakes[i] = transportWakeID(topic)
	}
	b := &pgx.Batch{}
	b.Queue("begin isolation level read committed")
	b.Queue(t.sql.ensureTopics, topics)
	b.Queue(t.sql.lockTopics, topics)
	b.Queue(t.sql.move, t.now(), seqs, t.db.storeNow(o.clock))
	b.Queue("commit")
	b.Queue(t.sql.notifyAfter, t.channel, wakes)
	var moved int64
	err = t.publishOwn(ctx, b, func(res pgx.BatchResults) error {
		for range 3 { // begin, ensure and lock the topics
			if _, err := res.Exec(); err != nil {
				return err
			}
		}
		return res.QueryRow().Scan(&moved)
	})
	if err != nil {
		return 0, true, fmt.Errorf("idempg: move outbox: %w", err)
	}
	for _, w := range wakes {
		t.waits.wake(w)
	}
	return int(moved), true, nil
}
