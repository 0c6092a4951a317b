package idempg

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

//go:embed transportmigrations/*.sql
var transportMigrationFiles embed.FS

// TransportComponent is the component under which NewTransport records its
// schema migrations in idem_schema_migrations.
const TransportComponent = "idem_transport"

// transportChannelSuffix ends the name of a schema's LISTEN/NOTIFY channel
// of the transport. It is no longer than pgsql.ChannelSuffix, so that the channel
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
// It matches idem.ErrStaleDelivery.
var ErrStaleDelivery = fmt.Errorf("idempg: delivery already settled or handed out again (%w)", idem.ErrStaleDelivery)

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
// Its streams are idem.BatchStream (NextBatch, AckBatch: one statement
// for many rows) and idem.BatchRenewer: InProgressBatch renews many
// deliveries with one UPDATE, in seq order, returning which rows it
// renewed. It locks with SKIP LOCKED and passes over a row another
// transaction holds (its settlement in flight, which decides it), neither
// renewed nor stale, so that a heartbeat never waits while holding the rows
// it renewed.
//
// A topic's messages come in publish order, except for redeliveries, which
// come again in order too, before newer messages. "Now" is the Clock's, or
// the database's: visibility never depends on the clocks of the processes.
//
// # Transactions
//
// Publish, a Delivery's Ack, Nack, Term and InProgress, and a stream's
// AckBatch and InProgressBatch, join the transaction ctx carries (see
// DB.WithTx), or run on their own. A service
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
	_ idem.Publisher    = (*Transport)(nil)
	_ idem.Subscriber   = (*Transport)(nil)
	_ idem.BatchStream  = (*pgStream)(nil)
	_ idem.BatchRenewer = (*pgStream)(nil)
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
	inProgress, inProgressMany, purge, moveLock, move                 string
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
		inProgressMany: r.Replace(inProgressManySQL),
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
