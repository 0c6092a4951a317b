package idempg

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// ensureTopicsSQL creates the topics' rows that are missing, in the
// transaction of the Publish or Subscribe, in order. Under REPEATABLE READ
// or SERIALIZABLE, a row another transaction committed after the snapshot
// makes it fail with a serialization failure: that transaction may be a
// first Subscribe this one would miss.
const ensureTopicsSQL = `INSERT INTO idem_transport_topics (topic)
	SELECT t FROM unnest($1::text[]) AS t ORDER BY t
	ON CONFLICT (topic) DO NOTHING`

// lockTopicsSQL locks the topics' rows FOR SHARE, in order, so that
// publishers and first subscribers never wait for each other in a cycle.
// Under REPEATABLE READ or SERIALIZABLE, a row a first Subscribe updated
// after the snapshot makes it fail with a serialization failure.
const lockTopicsSQL = `SELECT topic FROM idem_transport_topics WHERE topic = ANY($1::text[]) ORDER BY topic FOR SHARE`

// publishSQL appends the messages to the log, in order, and queues each for
// every consumer name of its topic. It runs after lockTopicsSQL, as a
// statement of its own: under READ COMMITTED its snapshot then shows every
// consumer name committed before the lock was granted.
const publishSQL = `WITH n AS MATERIALIZED (SELECT coalesce($1::timestamptz, clock_timestamp()) AS t),
m AS (
	INSERT INTO idem_transport_messages (topic, id, key, headers, headers_base64, payload, msg_time, published_at)
	SELECT u.topic, u.id, u.key, u.headers::jsonb, u.enc, u.payload, coalesce(u.msg_time, n.t), n.t
	FROM n, unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::boolean[], $7::bytea[], $8::timestamptz[])
		WITH ORDINALITY AS u(topic, id, key, headers, enc, payload, msg_time, ord)
	ORDER BY u.ord
	RETURNING seq, topic)
INSERT INTO idem_transport_pending (consumer_id, seq)
SELECT c.id, m.seq FROM m JOIN idem_transport_consumers AS c ON c.topic = m.topic`

// notifyInTxSQL notifies the topics in the caller's transaction: the
// notifications go out when it commits, and never if it rolls back.
const notifyInTxSQL = `SELECT pg_notify($1, w) FROM unnest($2::text[]) AS w`

// notifyAfterSQL notifies the topics after Publish's own transaction
// committed, in a transaction of its own: NOTIFY holds a database-wide lock
// until its transaction commits, which here does not wait for a WAL flush
// (losing a notification in a crash only leaves a stream to its poll).
const notifyAfterSQL = `SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, w) FROM unnest($2::text[]) AS w`

// Publish implements idem.Publisher, in the transaction ctx carries or one
// of its own. A zero Message.Time is set to the clock's time; times are
// kept to the microsecond, PostgreSQL's precision. Returns an
// error matching idem.ErrInvalidArgument, having published nothing, when a
// message does not validate, or its ID, topic or key holds a NUL byte or
// bytes that are not UTF-8 (PostgreSQL's text cannot hold them); and
// idem.ErrClosed after Close.
//
// On its own it takes one round trip: BEGIN, the topics' rows, the
// messages, COMMIT and the notifications in one pipeline. In the caller's
// transaction it also takes one, after the BEGIN of a transaction that has
// not begun yet.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	for _, m := range msgs {
		if err := m.Validate(); err != nil {
			return err
		}
		for _, f := range []struct{ name, v string }{
			{"Message.ID", m.ID}, {"Message.Topic", m.Topic}, {"Message.Key", m.Key},
		} {
			if err := pgsql.CheckText(f.name, f.v); err != nil {
				return err
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.isClosed() {
		return idem.ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	n := len(msgs)
	topics, ids, keys := make([]string, n), make([]string, n), make([]string, n)
	headers, encoded := make([]*string, n), make([]bool, n)
	payloads, times := make([][]byte, n), make([]pgtype.Timestamptz, n)
	for i, m := range msgs {
		h, enc, err := pgsql.HeadersArg(m.Headers)
		if err != nil {
			return fmt.Errorf("idempg: publish: %w", err)
		}
		topics[i], ids[i], keys[i], headers[i], encoded[i] = m.Topic, m.ID, m.Key, h, enc
		// A nil payload is stored empty: the column is NOT NULL.
		payloads[i] = m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		times[i] = pgtype.Timestamptz{Time: m.Time, Valid: !m.Time.IsZero()}
	}
	distinct := slices.Clone(topics)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	wakes := make([]string, len(distinct))
	for i, topic := range distinct {
		wakes[i] = transportWakeID(topic)
	}

	b := &pgx.Batch{}
	st, err := t.carried(ctx)
	if err != nil {
		return fmt.Errorf("idempg: publish: %w", err)
	}
	if st == nil {
		b.Queue("begin isolation level read committed")
	}
	b.Queue(t.sql.ensureTopics, distinct)
	b.Queue(t.sql.lockTopics, distinct)
	b.Queue(t.sql.publish, t.now(), topics, ids, keys, headers, encoded, payloads, times)
	if st != nil {
		b.Queue(t.sql.notifyInTx, t.channel, wakes)
		if err := execBatch(st.tx.SendBatch(ctx, b), b.Len()); err != nil {
			return fmt.Errorf("idempg: publish: %w", err)
		}
		return nil
	}
	b.Queue("commit")
	b.Queue(t.sql.notifyAfter, t.channel, wakes)
	if err := t.publishOwn(ctx, b, nil); err != nil {
		return fmt.Errorf("idempg: publish: %w", err)
	}
	// Streams of this process need not wait for the notification.
	for _, w := range wakes {
		t.waits.wake(w)
	}
	return nil
}

// publishOwn sends the batch of a Publish in a transaction of its own:
// BEGIN, its statements, COMMIT, and the notifications after it. read, when
// not nil, reads the results of the statements before the COMMIT;
// otherwise they are executed for their errors.
func (t *Transport) publishOwn(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	c, err := t.db.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// A statement refused before COMMIT leaves the transaction open
		// (aborted): rolled back here, so the connection goes back clean.
		if !c.Conn().IsClosed() && inTx(c) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			c.Exec(rctx, "rollback")
			cancel()
		}
		c.Release()
	}()
	res := c.SendBatch(ctx, b)
	err = func() error {
		if read != nil {
			if err := read(res); err != nil {
				return err
			}
		} else {
			for range b.Len() - 2 {
				if _, err := res.Exec(); err != nil {
					return err
				}
			}
		}
		return commitResult(res.Exec())
	}()
	// Once COMMIT has answered, a failed notification does not undo the
	// commit: it only leaves the streams to their poll.
	res.Close()
	return err
}

// execBatch runs the n statements of a batch, returning the first error.
func execBatch(res pgx.BatchResults, n int) error {
	var err error
	for range n {
		if _, err = res.Exec(); err != nil {
			break
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return err
}
