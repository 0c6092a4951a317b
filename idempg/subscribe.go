package idempg

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

const findConsumerSQL = `SELECT id FROM idem_transport_consumers WHERE topic = $1 AND consumer = $2`

// bumpTopicSQL is the first Subscribe's write to the topic row: it waits
// for every publisher holding the row, and keeps later ones waiting until
// the new consumer name commits (see Transport).
const bumpTopicSQL = `UPDATE idem_transport_topics SET subscribed = subscribed + 1 WHERE topic = $1`

const createConsumerSQL = `INSERT INTO idem_transport_consumers (topic, consumer, created_at)
	VALUES ($1, $2, coalesce($3::timestamptz, clock_timestamp()))
	ON CONFLICT (topic, consumer) DO NOTHING
	RETURNING id`

// backlogSQL queues the topic's log for a new consumer name.
const backlogSQL = `INSERT INTO idem_transport_pending (consumer_id, seq)
	SELECT $1, seq FROM idem_transport_messages WHERE topic = $2`

// Subscribe implements idem.Subscriber. The first Subscribe of a consumer
// name creates it, with every message of the topic still in the log
// queued for it, in a READ COMMITTED transaction of its own; it reads the
// whole log to find them, since an index by topic would cost every Publish
// more than it saves the rare first Subscribe. Returns an
// error matching idem.ErrInvalidArgument when sub has no Topic or Consumer,
// or one PostgreSQL's text cannot hold, or a negative AckWait or
// MaxInFlight; and idem.ErrClosed after Close.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	if err := sub.Validate(); err != nil {
		return nil, err
	}
	if err := pgsql.CheckText("Subscription.Topic", sub.Topic); err != nil {
		return nil, err
	}
	if err := pgsql.CheckText("Subscription.Consumer", sub.Consumer); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.isClosed() {
		return nil, idem.ErrClosed
	}
	if sub.AckWait == 0 {
		sub.AckWait = t.ackWait
	}
	if sub.MaxInFlight == 0 {
		sub.MaxInFlight = t.maxInFlight
	}
	id, err := t.consumerID(ctx, sub.Topic, sub.Consumer)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, fmt.Errorf("idempg: subscribe: %w", err)
	}
	var owner [8]byte
	rand.Read(owner[:])
	s := &pgStream{
		t:          t,
		sub:        sub,
		consumerID: id,
		wakeID:     transportWakeID(sub.Topic),
		id:         int64(binary.BigEndian.Uint64(owner[:]) >> 1),
		held:       make(map[int64]int64),
		done:       make(chan struct{}),
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, idem.ErrClosed
	}
	t.streams[s] = struct{}{}
	return s, nil
}

// consumerID returns the id of the consumer name of topic, creating it if
// needed.
func (t *Transport) consumerID(ctx context.Context, topic, consumer string) (int64, error) {
	var id int64
	err := t.db.pool.QueryRow(ctx, t.sql.findConsumer, topic, consumer).Scan(&id)
	if !errors.Is(err, pgx.ErrNoRows) {
		return id, err
	}
	err = pgx.BeginTxFunc(ctx, t.db.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, t.sql.ensureTopics, []string{topic}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, t.sql.bumpTopic, topic); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, t.sql.createConsumer, topic, consumer, t.now()).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			// Created by a Subscribe that held the topic row first.
			return tx.QueryRow(ctx, t.sql.findConsumer, topic, consumer).Scan(&id)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, t.sql.backlog, id, topic)
		return err
	})
	return id, err
}
