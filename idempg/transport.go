package idempg

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-go/idem"
)

//go:embed transportmigrations/*.sql
var transportMigrationFiles embed.FS

// TransportComponent is the component under which NewTransport records its
// schema migrations in idem_schema_migrations.
const TransportComponent = "idem_transport"

// transportChannelSuffix ends the name of a schema's LISTEN/NOTIFY channel
// of the transport. It is no longer than channelSuffix, so that the channel
// of any schema Open accepts fits PostgreSQL's 63-byte identifiers.
const transportChannelSuffix = "_idem_xprt"

// giveBackTimeout bounds the statement with which a closing stream gives
// back what it holds, which runs even when no context is left.
const giveBackTimeout = 5 * time.Second

// ErrStaleDelivery is returned by a Delivery's methods when it no longer
// stands for its message: it was settled already, a Nack gave it back, or
// the message has been handed out again since (after its AckWait ended, or
// its stream was closed). InProgress also returns it once the AckWait has
// ended, since the next holder may already be working on the message.
var ErrStaleDelivery = errors.New("idempg: delivery already settled or handed out again")

// TransportConfig configures NewTransport. The zero value is ready to use.
type TransportConfig struct {
	// Clock judges Nack delays, AckWaits and Purge's olderThan, and stamps
	// messages: its time is passed to every statement. Tests inject a
	// manual clock. Defaults to the DB's Config.Clock, and when that is nil
	// too, to the database's clock (clock_timestamp()), so that processes
	// whose clocks disagree still agree on when a delivery's AckWait ends.
	Clock idem.Clock
	// AckWait is the AckWait of subscriptions that leave it zero. Defaults
	// to 30s.
	AckWait time.Duration
	// MaxInFlight is the MaxInFlight of subscriptions that leave it zero:
	// how many deliveries one stream may hold unsettled. Defaults to 1000.
	MaxInFlight int
	// Poll is how often a waiting Next looks at the database again without
	// being woken: for a Nack delay or an AckWait that ended, and for what
	// a lost notification did not say. A message published (and a stream
	// closed) anywhere wakes it at once through LISTEN/NOTIFY, so an idle
	// stream issues one statement per Poll. With a Clock that tests move by
	// hand, make it a few milliseconds. Defaults to 1s.
	Poll time.Duration
}

// Transport is the database as an idem.Publisher and idem.Subscriber: the
// transport of a service that has PostgreSQL and no broker. Many processes
// share it, publishing and consuming at once.
//
// # Tables
//
// NewTransport migrates the component "idem_transport" into the DB's
// schema. Every published message is appended to one log,
// idem_transport_messages, ordered by an identity column seq. A consumer
// name of a topic (idem_transport_consumers) is a durable subscription,
// created by its first Subscribe, which starts at the oldest message of the
// topic left in the log, so nothing published before the first
// subscription is missed. Its queue is a row in idem_transport_pending per
// message it has not settled: the attempt count, when the row may be handed
// out again (visible_at) and which delivery holds it (owner, owner_token).
// So attempt counts, Nack delays and unsettled messages survive restarts,
// and streams in any number of processes share a consumer name as
// competing consumers, each message going to one of them at a time.
//
// Publish writes a message's log row and, in the same statement, one queue
// row for each consumer name its topic has. The first Subscribe of a
// consumer name copies the topic's log into its new queue. The two cannot
// miss each other: Publish holds the topic's row in idem_transport_topics
// FOR SHARE until its transaction ends (publishers do not wait for one
// another), and the first Subscribe updates that row before it looks at the
// log, which waits for every publisher holding it, and makes publishers that
// come later wait until the new consumer name is committed and then see it.
// A publisher under REPEATABLE READ or SERIALIZABLE whose snapshot is older
// than that update gets a serialization failure (SQLSTATE 40001), for its
// caller to retry, instead of a message the new consumer name never gets.
//
// # Taking a message
//
// A stream takes the oldest visible row of its consumer name's queue in one
// statement: SELECT ... ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED, then
// UPDATE of that row (attempts + 1, visible_at = now + AckWait, owner = the
// stream, owner_token = a new number), returning the message. Streams taking
// at once each lock a different row (SKIP LOCKED passes over rows another
// is taking), and a row taken and committed meanwhile is checked again
// under its lock by READ COMMITTED, where its new visible_at rules it out:
// no row is handed out twice while its AckWait runs. A delivery's Ack,
// Term, Nack and InProgress change the row only where owner and
// owner_token are still the delivery's, so a delivery whose message was
// handed out again gets ErrStaleDelivery and changes nothing. Ack and Term
// delete the row, Nack makes it visible again after its delay, InProgress
// starts the AckWait again, and closing a stream makes what it holds
// visible at once.
//
// A topic's messages come in publish order, except for redeliveries, which
// come again in order too, before newer messages. "Now" is the Clock's, or
// the database's: visibility never depends on the clocks of the processes.
//
// # Transactions
//
// Publish, and a Delivery's Ack, Nack, Term and InProgress, join the
// transaction ctx carries (see DB.WithTx), or run on their own. A service
// without an outbox may publish in the transaction of its effect: a message
// published in a transaction that rolls back is never delivered. A consumer
// may acknowledge in the transaction of its inbox row. On their own,
// Publish commits durably; taking a message and settling it commit with
// synchronous_commit off, since losing either to a crash only hands the
// message out once more, which delivery at least once allows and the inbox
// absorbs. Next and Subscribe always run on their own: Subscribe in a READ
// COMMITTED transaction of its own, so it must not be called while the
// caller's transaction has published to the topic of a consumer name that
// does not exist yet (it would wait for that transaction).
//
// # Wake-ups
//
// A waiting Next sleeps until a notification on the channel
// "<schema>_idem_xprt" names its topic, or Poll passes. Publish notifies
// the topics it published to after its commit (in the caller's transaction,
// where the notification goes out when it commits; PostgreSQL then holds
// its database-wide notification lock through that commit, so heavy
// in-transaction publishing is better done through an outbox), and a
// closing stream notifies what it gave back. Each Transport keeps one
// dedicated LISTEN connection besides the pool, opened by the first Next;
// it does not work through a pooler in transaction mode (PgBouncer), where
// Next falls back to polling.
//
// Publish does not de-duplicate; consumers do. The log is kept until Purge
// deletes what every consumer name has settled. It passes
// idemtest.TestTransport with DelayedNack, AttemptCount, AckWait,
// InProgress, Term and OrderedPerTopic.
type Transport struct {
	db          *DB
	clock       idem.Clock
	ackWait     time.Duration
	maxInFlight int
	poll        time.Duration
	channel     string
	waits       *listener
	sql         transportSQL

	mu      sync.Mutex
	closed  bool
	streams map[*pgStream]struct{}

	// onWait, when set (by tests), is called each time a Next, having
	// found nothing, starts to wait.
	onWait func()
}

var (
	_ idem.Publisher   = (*Transport)(nil)
	_ idem.Subscriber  = (*Transport)(nil)
	_ idem.BatchStream = (*pgStream)(nil)
)

// NewTransport applies the transport's migrations to db (component
// "idem_transport") and returns a Transport on it. cfg may be nil; fields
// that are zero or negative take their defaults. Close it before db.
func NewTransport(ctx context.Context, db *DB, cfg *TransportConfig) (*Transport, error) {
	if db == nil {
		return nil, &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	var c TransportConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = db.clock
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 1000
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	sub, err := fs.Sub(transportMigrationFiles, "transportmigrations")
	if err != nil {
		return nil, fmt.Errorf("idempg: %w", err)
	}
	if err := db.Migrate(ctx, TransportComponent, sub); err != nil {
		return nil, err
	}
	channel := db.schema + transportChannelSuffix
	return &Transport{
		db:          db,
		clock:       c.Clock,
		ackWait:     c.AckWait,
		maxInFlight: c.MaxInFlight,
		poll:        c.Poll,
		channel:     channel,
		waits:       newListener(db, channel),
		sql:         newTransportSQL(db.schema),
		streams:     make(map[*pgStream]struct{}),
	}, nil
}

// transportSQL are the transport's statements, with its tables qualified by
// the schema: Publish and the Delivery methods may run in the caller's
// transaction, whose search_path the caller may have changed.
type transportSQL struct {
	lockTopics, ensureTopics, publish, notifyInTx, notifyAfter        string
	findConsumer, bumpTopic, createConsumer, backlog                  string
	take, untake, dropOrphan, stillHeld, giveBack, ack, ackMany, nack string
	inProgress, purge, moveLock, move                                 string
}

func newTransportSQL(schema string) transportSQL {
	r := strings.NewReplacer("idem_transport_", quoteIdent(schema)+".idem_transport_", "idem_outbox", quoteIdent(schema)+".idem_outbox")
	return transportSQL{
		lockTopics:     r.Replace(lockTopicsSQL),
		ensureTopics:   r.Replace(ensureTopicsSQL),
		publish:        r.Replace(publishSQL),
		notifyInTx:     notifyInTxSQL,
		notifyAfter:    notifyAfterSQL,
		findConsumer:   r.Replace(findConsumerSQL),
		bumpTopic:      r.Replace(bumpTopicSQL),
		createConsumer: r.Replace(createConsumerSQL),
		backlog:        r.Replace(backlogSQL),
		take:           r.Replace(takeSQL),
		untake:         r.Replace(untakeSQL),
		ackMany:        r.Replace(ackManySQL),
		moveLock:       r.Replace(moveLockSQL),
		move:           r.Replace(moveSQL),
		dropOrphan:     r.Replace(dropOrphanSQL),
		stillHeld:      r.Replace(stillHeldSQL),
		giveBack:       r.Replace(giveBackSQL),
		ack:            r.Replace(ackSQL),
		nack:           r.Replace(nackSQL),
		inProgress:     r.Replace(inProgressSQL),
		purge:          r.Replace(transportPurgeSQL),
	}
}

// transportWakeID is the payload that tells waiting streams which topic
// changed: a short hash, so that any topic fits in a notification and none
// is revealed in the server's logs. Topics sharing one only wake each
// other's streams spuriously.
func transportWakeID(topic string) string {
	h := sha256.Sum256([]byte("idem_transport\x00" + topic))
	return hex.EncodeToString(h[:8])
}

// now returns the time parameter of a statement: the clock's time, or nil,
// for which the SQL reads the database's clock.
func (t *Transport) now() any {
	if t.clock == nil {
		return nil
	}
	return t.clock.Now()
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// carried returns the transaction ctx carries, or nil.
func (t *Transport) carried(ctx context.Context) (*txState, error) {
	st := t.db.carried(ctx)
	if st != nil && st.isEnded() {
		return nil, &txError{"begin", errTxEnded}
	}
	return st, nil
}

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
			if err := checkText(f.name, f.v); err != nil {
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
		h, enc, err := headersArg(m.Headers)
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
	if err := checkText("Subscription.Topic", sub.Topic); err != nil {
		return nil, err
	}
	if err := checkText("Subscription.Consumer", sub.Consumer); err != nil {
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

// Close closes every stream, giving back what they hold, stops the LISTEN
// connection, and makes Publish, Subscribe and the methods of unsettled
// deliveries return idem.ErrClosed. It does not close the DB. Closing
// twice is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	streams := make([]*pgStream, 0, len(t.streams))
	for s := range t.streams {
		streams = append(streams, s)
	}
	t.mu.Unlock()
	var errs []error
	for _, s := range streams {
		errs = append(errs, s.Close())
	}
	t.waits.close()
	return errors.Join(errs...)
}

// transportPurgeSQL deletes up to $2 messages published before $1 that no
// consumer name of their topic has in its queue. SKIP LOCKED lets several
// purgers share the work.
const transportPurgeSQL = `WITH doomed AS (
	SELECT m.seq FROM idem_transport_messages AS m
	WHERE m.published_at < $1
	  AND NOT EXISTS (SELECT 1 FROM idem_transport_consumers AS c
		JOIN idem_transport_pending AS p ON p.consumer_id = c.id AND p.seq = m.seq
		WHERE c.topic = m.topic)
	ORDER BY m.seq LIMIT $2
	FOR UPDATE OF m SKIP LOCKED)
DELETE FROM idem_transport_messages AS m USING doomed WHERE m.seq = doomed.seq`

// Purge deletes at most limit messages of the log that were published
// before olderThan and that every consumer name of their topic has settled
// (or that no consumer name wanted), and returns how many it deleted. Call
// it until it returns fewer than limit. It joins the transaction ctx
// carries, if any.
//
// A consumer name that subscribes for the first time after a purge starts
// from the oldest message left, so it does not see the purged ones: keep
// the log as long as a new consumer name should be able to read it from
// the start. Returns an error matching idem.ErrInvalidArgument when limit
// is not positive.
func (t *Transport) Purge(ctx context.Context, olderThan time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	q, err := t.q(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempg: purge transport: %w", err)
	}
	tag, err := q.Exec(ctx, t.sql.purge, olderThan, int64(limit))
	if err != nil {
		return 0, fmt.Errorf("idempg: purge transport: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// q returns what a statement that may join the caller's transaction runs
// on: that transaction, or the pool, where it commits on its own.
func (t *Transport) q(ctx context.Context) (querier, error) {
	st, err := t.carried(ctx)
	switch {
	case err != nil:
		return nil, err
	case st != nil:
		return st.tx, nil
	}
	return t.db.pool, nil
}

type pgStream struct {
	t          *Transport
	sub        idem.Subscription
	consumerID int64
	wakeID     string
	// id names the stream in the owner column of what it holds; tokens
	// number its deliveries, so a delivery can tell it is stale.
	id     int64
	tokens atomic.Int64

	mu sync.Mutex
	// held maps the seqs of the messages the stream has handed out and
	// not seen settled to their delivery's token: what MaxInFlight counts
	// and Close gives back.
	held map[int64]int64

	closeOnce sync.Once
	done      chan struct{}
}

// Next implements idem.Stream. It never joins the transaction ctx carries.
func (s *pgStream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.next(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

// NextBatch implements idem.BatchStream: up to max messages in one
// statement. It never joins the transaction ctx carries.
func (s *pgStream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	return s.next(ctx, max)
}

// next waits for, and takes, up to limit messages.
func (s *pgStream) next(ctx context.Context, limit int) ([]idem.Delivery, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-s.done:
			return nil, idem.ErrClosed
		default:
		}
		// Listened for before looking, so that a publish notified after
		// the look is not slept through.
		changed, unregister, err := s.t.waits.register(s.wakeID)
		if err != nil {
			return nil, idem.ErrClosed
		}
		ds, err := s.take(ctx, limit)
		if err != nil || len(ds) > 0 {
			unregister()
			if err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return nil, cerr
				}
				if errors.Is(err, idem.ErrClosed) {
					return nil, err
				}
				return nil, fmt.Errorf("idempg: next: %w", err)
			}
			return ds, nil
		}
		if timer == nil {
			timer = time.NewTimer(s.t.poll)
		} else {
			timer.Reset(s.t.poll)
		}
		if s.t.onWait != nil {
			s.t.onWait()
		}
		select {
		case <-ctx.Done():
			unregister()
			return nil, ctx.Err()
		case <-s.done:
			unregister()
			return nil, idem.ErrClosed
		case <-changed:
		case <-timer.C:
		}
		unregister()
	}
}

// takeSQL hands out up to $6 of the oldest visible messages of a consumer
// name's queue to a stream (see Transport, "Taking a message"), in one
// statement, which commits on its own with synchronous_commit off. It
// returns no row when none is visible, and a row whose found is false for a
// message purged while the consumer name was being created (its queue row
// is then an orphan). Its rows come in no particular order.
const takeSQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($2::timestamptz, clock_timestamp()) AS t,
		set_config('synchronous_commit', 'off', true) AS async),
next AS (
	SELECT p.seq FROM idem_transport_pending AS p, n
	WHERE p.consumer_id = $1 AND p.visible_at <= n.t
	ORDER BY p.seq LIMIT $6
	FOR UPDATE OF p SKIP LOCKED),
taken AS (
	UPDATE idem_transport_pending AS p
	SET attempts = p.attempts + 1, visible_at = n.t + $3::bigint * interval '1 microsecond',
		owner = $4, owner_token = $5
	FROM next, n
	WHERE p.consumer_id = $1 AND p.seq = next.seq
	RETURNING p.seq, p.attempts)
SELECT taken.seq, taken.attempts, m.seq IS NOT NULL,
	coalesce(m.id, ''), coalesce(m.topic, ''), coalesce(m.key, ''), m.headers,
	coalesce(m.headers_base64, false), m.payload, m.msg_time
FROM taken LEFT JOIN idem_transport_messages AS m ON m.seq = taken.seq`

// untakeSQL undoes a take whose caller went away before it got the
// messages: they are visible again at once, with the attempt it counted
// taken back, and notified when there were any.
const untakeSQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($4::timestamptz, clock_timestamp()) AS t,
		set_config('synchronous_commit', 'off', true) AS async),
given AS (
	UPDATE idem_transport_pending AS p
	SET visible_at = n.t, attempts = greatest(p.attempts - 1, 0), owner = NULL, owner_token = NULL
	FROM n
	WHERE p.consumer_id = $1 AND p.owner = $2 AND p.owner_token = $3
	RETURNING 1)
SELECT pg_notify($5, $6) WHERE EXISTS (SELECT FROM given)`

// takeTimeout bounds the take statement, which runs apart from the caller's
// context (see take).
const takeTimeout = 10 * time.Second

const dropOrphanSQL = `DELETE FROM idem_transport_pending
	WHERE consumer_id = $1 AND seq = $2 AND owner = $3 AND owner_token = $4`

// stillHeldSQL returns which of the seqs the stream still holds under a
// running AckWait.
const stillHeldSQL = `SELECT p.seq FROM idem_transport_pending AS p,
	(SELECT coalesce($4::timestamptz, clock_timestamp()) AS t) AS n
	WHERE p.consumer_id = $1 AND p.seq = ANY($2::bigint[]) AND p.owner = $3 AND p.visible_at > n.t`

// take hands out up to limit of the oldest messages the stream may have
// now, oldest first, or none.
//
// The statement runs apart from ctx's cancellation, for at most
// takeTimeout: a statement cancelled while in flight may have committed
// its hand-out on the server all the same, and the stream would then hold
// messages it never handed out, for a whole AckWait. Once it has answered,
// a caller gone meanwhile gets nothing, and what was taken for it is given
// back at once, its attempt uncounted.
func (s *pgStream) take(ctx context.Context, limit int) ([]idem.Delivery, error) {
	for {
		room, err := s.room(ctx)
		if err != nil || room == 0 {
			return nil, err
		}
		limit = min(limit, room)
		token := s.tokens.Add(1)
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), takeTimeout)
		ds, orphans, err := s.takeRows(tctx, token, limit)
		cancel()
		if err != nil {
			// A take that failed or timed out may still have committed.
			s.untake(token)
			return nil, err
		}
		select {
		case <-s.done:
			// Close may have given back what the stream held before
			// these messages were added: give them back here.
			s.untake(token)
			return nil, idem.ErrClosed
		default:
		}
		if ctx.Err() != nil {
			s.untake(token)
			return nil, ctx.Err()
		}
		for _, seq := range orphans {
			if _, err := s.t.db.pool.Exec(ctx, s.t.sql.dropOrphan, s.consumerID, seq, s.id, token); err != nil {
				s.untake(token)
				return nil, err
			}
		}
		s.mu.Lock()
		for _, d := range ds {
			s.held[d.(*pgDelivery).seq] = token
		}
		s.mu.Unlock()
		if len(ds) > 0 || len(orphans) == 0 {
			return ds, nil
		}
		// Only orphans: look again.
	}
}

// takeRows runs the take statement and reads what it handed out, oldest
// first, and the seqs of the orphans among them.
func (s *pgStream) takeRows(ctx context.Context, token int64, limit int) ([]idem.Delivery, []int64, error) {
	rows, err := s.t.db.pool.Query(ctx, s.t.sql.take, s.consumerID, s.t.now(), micros(s.sub.AckWait), s.id, token, int64(limit))
	if err != nil {
		return nil, nil, err
	}
	var (
		ds      []idem.Delivery
		orphans []int64
		seq     int64
		attempt int32
		found   bool
		r       messageRow
	)
	_, err = pgx.ForEachRow(rows, append([]any{&seq, &attempt, &found}, r.dest()...), func() error {
		if !found {
			orphans = append(orphans, seq)
			return nil
		}
		m, err := r.message()
		if err != nil {
			return fmt.Errorf("message %d of the log: %w", seq, err)
		}
		ds = append(ds, &pgDelivery{s: s, seq: seq, token: token, attempt: int(attempt), msg: m})
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(ds, func(a, b idem.Delivery) int { return cmp.Compare(a.(*pgDelivery).seq, b.(*pgDelivery).seq) })
	return ds, orphans, nil
}

// untake gives back at once what the take of token handed out, if anything.
func (s *pgStream) untake(token int64) {
	ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
	defer cancel()
	if _, err := s.t.db.pool.Exec(ctx, s.t.sql.untake, s.consumerID, s.id, token, s.t.now(), s.t.channel, s.wakeID); err == nil {
		s.t.waits.wake(s.wakeID)
	}
}

// room returns how many more deliveries the stream may hold under
// MaxInFlight. At the limit it asks the database which of them are still
// held, since AckWaits end and the messages go to other streams without
// this one hearing of it.
func (s *pgStream) room(ctx context.Context) (int, error) {
	s.mu.Lock()
	if n := s.sub.MaxInFlight - len(s.held); n > 0 {
		s.mu.Unlock()
		return n, nil
	}
	looked := make(map[int64]int64, len(s.held))
	seqs := make([]int64, 0, len(s.held))
	for seq, token := range s.held {
		looked[seq] = token
		seqs = append(seqs, seq)
	}
	s.mu.Unlock()
	rows, err := s.t.db.pool.Query(ctx, s.t.sql.stillHeld, s.consumerID, seqs, s.id, s.t.now())
	if err != nil {
		return 0, err
	}
	live, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, err
	}
	for _, seq := range live {
		delete(looked, seq)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, token := range looked {
		if s.held[seq] == token {
			delete(s.held, seq)
		}
	}
	return max(s.sub.MaxInFlight-len(s.held), 0), nil
}

// forget drops a delivery from what the stream holds.
func (s *pgStream) forget(seq, token int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[seq] == token {
		delete(s.held, seq)
	}
}

// giveBackSQL ends the AckWaits of the messages a closing stream holds,
// but keeps the stream as their owner, so that a delivery may still be
// settled until the message goes out again; and it notifies their topic
// when there was any. It commits on its own with synchronous_commit off: a
// give-back lost in a crash only leaves the message to its AckWait.
const giveBackSQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($3::timestamptz, clock_timestamp()) AS t,
		set_config('synchronous_commit', 'off', true) AS async),
given AS (
	UPDATE idem_transport_pending AS p SET visible_at = n.t FROM n
	WHERE p.consumer_id = $1 AND p.seq = ANY($2::bigint[]) AND p.owner = $4 AND p.visible_at > n.t
	RETURNING 1)
SELECT pg_notify($5, $6) WHERE EXISTS (SELECT FROM given)`

// giveBack makes the messages visible again at once, if the stream still
// holds them.
func (s *pgStream) giveBack(seqs []int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
	defer cancel()
	_, err := s.t.db.pool.Exec(ctx, s.t.sql.giveBack, s.consumerID, seqs, s.t.now(), s.id, s.t.channel, s.wakeID)
	s.t.waits.wake(s.wakeID)
	return err
}

// Close implements idem.Stream: the messages the stream holds may be
// handed out again at once, to its consumer name's other streams, here or
// in other processes, or to its next one.
func (s *pgStream) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.done)
		s.t.mu.Lock()
		delete(s.t.streams, s)
		s.t.mu.Unlock()
		s.mu.Lock()
		seqs := make([]int64, 0, len(s.held))
		for seq := range s.held {
			seqs = append(seqs, seq)
		}
		s.mu.Unlock()
		if len(seqs) > 0 {
			if err = s.giveBack(seqs); err != nil {
				err = fmt.Errorf("idempg: close stream: %w", err)
			}
		}
	})
	return err
}

// ackManySQL deletes the queue rows of the deliveries that still hold them.
// $5 turns synchronous_commit off when it commits on its own.
const ackManySQL = `WITH n AS MATERIALIZED (
	SELECT CASE WHEN $5::boolean THEN set_config('synchronous_commit', 'off', true) END AS async)
DELETE FROM idem_transport_pending AS p USING n, unnest($3::bigint[], $4::bigint[]) AS d(seq, token)
	WHERE p.consumer_id = $1 AND p.owner = $2 AND p.seq = d.seq AND p.owner_token = d.token`

// AckBatch implements idem.BatchStream: one statement deletes the queue
// rows of every delivery that still holds its message, in the transaction
// ctx carries if any (see Transport, "Transactions"). Deliveries of another
// stream are refused with an error matching idem.ErrInvalidArgument.
func (s *pgStream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	seqs, tokens := make([]int64, len(ds)), make([]int64, len(ds))
	for i, d := range ds {
		pd, ok := d.(*pgDelivery)
		if !ok || pd.s != s {
			return 0, &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		seqs[i], tokens[i] = pd.seq, pd.token
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	t := s.t
	if t.isClosed() {
		return 0, fmt.Errorf("idempg: ack: %w", idem.ErrClosed)
	}
	st, err := t.carried(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempg: ack: %w", err)
	}
	var q querier = t.db.pool
	if st != nil {
		q = st.tx
	}
	tag, err := q.Exec(ctx, t.sql.ackMany, s.consumerID, s.id, seqs, tokens, st == nil)
	if err != nil {
		return 0, fmt.Errorf("idempg: ack: %w", err)
	}
	// As for Ack: forgotten before the caller's transaction commits; should
	// it roll back, the stream's Close leaves the messages to their
	// AckWait.
	s.mu.Lock()
	for i, seq := range seqs {
		if s.held[seq] == tokens[i] {
			delete(s.held, seq)
		}
	}
	s.mu.Unlock()
	t.waits.wake(s.wakeID)
	return int(tag.RowsAffected()), nil
}

// AcksInTx implements idem.BatchStream: AckBatch joins the transaction
// ctx carries when it is one of the Transport's DB.
func (s *pgStream) AcksInTx(ctx context.Context) bool {
	st, err := s.t.carried(ctx)
	return err == nil && st != nil
}

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
// negative delay counts as zero.
func (d *pgDelivery) Nack(ctx context.Context, delay time.Duration) error {
	return d.update(ctx, "nack", true, d.s.t.sql.nack, d.s.t.now(), micros(max(delay, 0)))
}

// InProgress implements idem.Delivery, in the transaction ctx carries if
// any: the delivery's AckWait starts again. Returns ErrStaleDelivery once
// the AckWait has ended.
func (d *pgDelivery) InProgress(ctx context.Context) error {
	return d.update(ctx, "in progress", false, d.s.t.sql.inProgress, d.s.t.now(), micros(d.s.sub.AckWait))
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
