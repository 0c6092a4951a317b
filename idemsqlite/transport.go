package idemsqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// ErrStaleDelivery is returned by a Delivery's methods when it no longer
// stands for its message: it was settled already, a Nack gave it back, or
// the message has been handed out again since (after its AckWait ended, or
// its stream was closed). InProgress also returns it once the AckWait has
// ended, since the next holder may already be working on the message.
// It matches idem.ErrStaleDelivery.
var ErrStaleDelivery = fmt.Errorf("idemsqlite: delivery already settled or handed out again (%w)", idem.ErrStaleDelivery)

// TransportConfig configures NewTransport. The zero value is ready to use.
type TransportConfig struct {
	// Clock judges Nack delays and AckWaits. Defaults to idem.SystemClock.
	Clock idem.Clock
	// AckWait is the AckWait of subscriptions that leave it zero. Defaults
	// to 30s.
	AckWait time.Duration
	// MaxInFlight is the MaxInFlight of subscriptions that leave it zero.
	// Defaults to 1000.
	MaxInFlight int
	// Poll is how often a waiting Next looks at the database again: for a
	// Nack delay or an AckWait that ended, and for messages published by
	// another process. A Publish, a move or a settlement through the same
	// Transport wakes it at once, so an idle stream issues one read per
	// Poll. Defaults to 1s.
	Poll time.Duration
}

// Transport is the database as an idem.Publisher and idem.Subscriber: the
// embedded transport, which needs no broker.
//
// Every published message is appended to one log (the table
// idem_transport_messages, ordered by an autoincrement seq). A consumer
// name is a durable cursor over one topic's log, created by its first
// Subscribe, which starts at the beginning of the log (so nothing published
// before the first subscription is missed), plus a row per message handed
// out and not settled (idem_transport_pending): its attempt count, when it
// may be handed out again (visible_at) and which delivery holds it. So the
// attempt count, Nack delays and unsettled messages survive a restart, and
// several processes on one file share a consumer name as competing
// consumers, each message going to one of them.
//
// A message is handed out oldest first: a topic's messages come in publish
// order, except for redeliveries, which come again in order too, before
// newer messages. It comes again after a Nack's delay, when its AckWait ends
// without a settlement or InProgress, and at once when its stream is
// closed. Choosing and leasing a message is one write transaction on the
// single writer connection, so no two streams get it at once.
//
// Publish, and a Delivery's Ack, Nack, Term and InProgress, go through
// db.WithTx: they join the transaction ctx carries. A service without an
// outbox may publish in the transaction of its effect; a consumer may
// acknowledge in the transaction of its inbox row.
//
// Its streams are idem.BatchStream: NextBatch hands out many messages in
// one write transaction, and AckBatch settles many with one statement, in
// the transaction ctx carries. They are idem.BatchRenewer too:
// InProgressBatch renews the AckWait of many with one statement, also in
// the transaction ctx carries. The Transport is an idem.OutboxMover for an
// Outbox of its own DB: MoveOutbox moves entries from the outbox into the
// log in one transaction, so a relay publishes nothing twice.
//
// Publish does not de-duplicate; consumers do. The log is kept until
// Purge deletes what every consumer name has settled.
//
// It passes idemtest.TestTransport with every feature it can promise:
// DelayedNack, AttemptCount, AckWait, InProgress, Term and OrderedPerTopic;
// it runs on its Clock, not real time.
type Transport struct {
	db          *DB
	clock       idem.Clock
	ackWait     time.Duration
	maxInFlight int
	poll        time.Duration

	mu      sync.Mutex
	closed  bool
	changed chan struct{}
	streams map[*dbStream]struct{}
}

var (
	_ idem.Publisher    = (*Transport)(nil)
	_ idem.Subscriber   = (*Transport)(nil)
	_ idem.OutboxMover  = (*Transport)(nil)
	_ idem.BatchStream  = (*dbStream)(nil)
	_ idem.BatchRenewer = (*dbStream)(nil)
)

// The transport's statements, prepared once per DB.
var (
	sqlPublish = messagesSQL(`INSERT INTO idem_transport_messages (topic, id, key, headers, payload, msg_time, published_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`)
	sqlSubscribe = messagesSQL(`INSERT INTO idem_transport_consumers (topic, consumer, cursor) VALUES (?, ?, 0)
		ON CONFLICT (topic, consumer) DO NOTHING`)
	sqlPurgeTransport = messagesSQL(`DELETE FROM idem_transport_messages WHERE seq IN (
		SELECT m.seq FROM idem_transport_messages m
		WHERE m.published_at < ?
		  AND NOT EXISTS (SELECT 1 FROM idem_transport_consumers c WHERE c.topic = m.topic AND c.cursor < m.seq)
		  AND NOT EXISTS (SELECT 1 FROM idem_transport_pending p WHERE p.seq = m.seq)
		ORDER BY m.seq LIMIT ?)`)
	// MoveOutbox's pair: the same entries (the oldest not under a live
	// lease) are copied into the log, in order, and deleted from the
	// outbox. The columns are stored alike in both tables; a zero msg_time
	// becomes the publish time, as Publish makes it.
	sqlMoveOutbox = messagesSQL(`INSERT INTO idem_transport_messages (topic, id, key, headers, payload, msg_time, published_at)
		SELECT topic, id, key, headers, payload, CASE msg_time WHEN 0 THEN ?1 ELSE msg_time END, ?1
		FROM idem_outbox WHERE lease_until <= ?2 ORDER BY seq LIMIT ?3`)
	sqlMovedOutbox = messagesSQL(`DELETE FROM idem_outbox WHERE seq IN (
		SELECT seq FROM idem_outbox WHERE lease_until <= ?1 ORDER BY seq LIMIT ?2)`)

	// Whether a consumer name has anything to hand out: a message whose
	// AckWait or Nack delay ended, or one past its cursor.
	sqlDue = messagesSQL(`SELECT
		EXISTS (SELECT 1 FROM idem_transport_pending WHERE topic = ?1 AND consumer = ?2 AND visible_at <= ?3)
		OR EXISTS (SELECT 1 FROM idem_transport_messages m, idem_transport_consumers c
			WHERE c.topic = ?1 AND c.consumer = ?2 AND m.topic = c.topic AND m.seq > c.cursor)`)
	// A take's look: how many messages are in flight, how many (up to ?4)
	// may be handed out again, and the cursor.
	sqlTakeState = messagesSQL(`SELECT
		(SELECT count(*) FROM idem_transport_pending
			WHERE topic = ?1 AND consumer = ?2 AND owner IS NOT NULL AND visible_at > ?3),
		(SELECT count(*) FROM (SELECT 1 FROM idem_transport_pending
			WHERE topic = ?1 AND consumer = ?2 AND visible_at <= ?3 LIMIT ?4)),
		(SELECT cursor FROM idem_transport_consumers WHERE topic = ?1 AND consumer = ?2)`)
	// Up to ?4 messages past the cursor ?3 become pending, visible at once
	// and not yet attempted; then the cursor moves past them.
	sqlTakeFresh = messagesSQL(`INSERT INTO idem_transport_pending (topic, consumer, seq, attempts, visible_at)
		SELECT topic, ?2, seq, 0, 0 FROM idem_transport_messages WHERE topic = ?1 AND seq > ?3 ORDER BY seq LIMIT ?4`)
	sqlMoveCursor = messagesSQL(`UPDATE idem_transport_consumers
		SET cursor = (SELECT max(seq) FROM idem_transport_pending WHERE topic = ?1 AND consumer = ?2)
		WHERE topic = ?1 AND consumer = ?2`)
	// The oldest ?7 visible pending messages go to the delivery (?2, ?3);
	// RETURNING gives them in no particular order.
	sqlHandOut = messagesSQL(`UPDATE idem_transport_pending SET attempts = attempts + 1, visible_at = ?1, owner = ?2, owner_token = ?3
		WHERE topic = ?4 AND consumer = ?5 AND seq IN (SELECT seq FROM idem_transport_pending
			WHERE topic = ?4 AND consumer = ?5 AND visible_at <= ?6 ORDER BY seq LIMIT ?7)
		RETURNING seq, attempts`)
	// The seqs come as a JSON array.
	sqlHandedOut = messagesSQL(`SELECT seq, id, topic, key, headers, payload, msg_time FROM idem_transport_messages
		WHERE seq IN (SELECT value FROM json_each(?))`)
	// Close ends the AckWaits of what a stream holds, keeping it the owner.
	sqlGiveBack = messagesSQL(`UPDATE idem_transport_pending SET visible_at = ?1
		WHERE topic = ?2 AND consumer = ?3 AND owner = ?4 AND visible_at > ?1`)

	// The settlements of one delivery: each changes its message's pending
	// row only while the delivery (?2, ?3) holds it.
	sqlAck = messagesSQL(`DELETE FROM idem_transport_pending
		WHERE topic = ?4 AND consumer = ?5 AND seq = ?1 AND owner = ?2 AND owner_token = ?3`)
	sqlNack = messagesSQL(`UPDATE idem_transport_pending SET visible_at = ?6, owner = NULL, owner_token = NULL
		WHERE topic = ?4 AND consumer = ?5 AND seq = ?1 AND owner = ?2 AND owner_token = ?3`)
	// InProgress only while the AckWait lasts (?7 is now).
	sqlInProgress = messagesSQL(`UPDATE idem_transport_pending SET visible_at = ?6
		WHERE topic = ?4 AND consumer = ?5 AND seq = ?1 AND owner = ?2 AND owner_token = ?3 AND visible_at > ?7`)
	// AckBatch's: the deliveries come as a JSON array of [seq, token]
	// pairs, all of the stream ?3. CROSS JOIN makes SQLite loop over the
	// pairs and look each row up by its key, where it would otherwise loop
	// over every pending row of the consumer name.
	sqlAckBatch = messagesSQL(`DELETE FROM idem_transport_pending WHERE rowid IN (
		SELECT p.rowid FROM json_each(?4) d CROSS JOIN idem_transport_pending p
		ON p.topic = ?1 AND p.consumer = ?2 AND p.seq = d.value ->> 0 AND p.owner = ?3 AND p.owner_token = d.value ->> 1)`)
	// InProgressBatch's: sqlInProgress for the pairs of AckBatch's form
	// (?4), each only while its AckWait lasts (?6 is now); it returns the
	// seq and token of each row it renewed.
	sqlInProgressBatch = messagesSQL(`UPDATE idem_transport_pending SET visible_at = ?5 WHERE rowid IN (
		SELECT p.rowid FROM json_each(?4) d CROSS JOIN idem_transport_pending p
		ON p.topic = ?1 AND p.consumer = ?2 AND p.seq = d.value ->> 0 AND p.owner = ?3 AND p.owner_token = d.value ->> 1
		WHERE p.visible_at > ?6)
		RETURNING seq, owner_token`)
)

// NewTransport applies the message tables' migrations to db (component
// "idem_messages") and returns a Transport on it. cfg may be nil; fields
// that are zero or negative take their defaults.
func NewTransport(ctx context.Context, db *DB, cfg *TransportConfig) (*Transport, error) {
	var c TransportConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
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
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &Transport{
		db:          db,
		clock:       c.Clock,
		ackWait:     c.AckWait,
		maxInFlight: c.MaxInFlight,
		poll:        c.Poll,
		changed:     make(chan struct{}),
		streams:     make(map[*dbStream]struct{}),
	}, nil
}

// signal wakes every waiting Next of t.
func (t *Transport) signal() {
	t.mu.Lock()
	defer t.mu.Unlock()
	close(t.changed)
	t.changed = make(chan struct{})
}

// Publish implements idem.Publisher, in the transaction ctx carries or one
// of its own. A zero Message.Time is set to the clock's time. Returns an
// error matching idem.ErrInvalidArgument, having published nothing, when a
// message does not validate, and idem.ErrClosed after Close.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	for _, m := range msgs {
		if err := m.Validate(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return idem.ErrClosed
	}
	now := t.clock.Now()
	err := t.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		publish := t.db.in(tx).bind(ctx, sqlPublish)
		for _, m := range msgs {
			if m.Time.IsZero() {
				m.Time = now
			}
			h, err := encodeHeaders(m.Headers)
			if err != nil {
				return err
			}
			if _, err := publish.exec(ctx, m.Topic, m.ID, m.Key, h, payloadArg(m.Payload), msgNanos(m.Time), now.UnixNano()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: publish: %w", err)
	}
	// A waiting Next woken before the caller's transaction commits does
	// not see the messages yet; it finds them at its next poll.
	t.signal()
	return nil
}

// Subscribe implements idem.Subscriber. Returns an error matching
// idem.ErrInvalidArgument when sub has no Topic or Consumer, or a negative
// AckWait or MaxInFlight, and idem.ErrClosed after Close.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	if err := sub.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if sub.AckWait == 0 {
		sub.AckWait = t.ackWait
	}
	if sub.MaxInFlight == 0 {
		sub.MaxInFlight = t.maxInFlight
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, idem.ErrClosed
	}
	err := t.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := t.db.in(tx).exec(ctx, sqlSubscribe, sub.Topic, sub.Consumer)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: subscribe: %w", err)
	}
	s := &dbStream{t: t, sub: sub, id: rand.Text(), done: make(chan struct{})}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, idem.ErrClosed
	}
	t.streams[s] = struct{}{}
	return s, nil
}

// Close closes every stream, giving back what they hold, and makes
// Publish, Subscribe and the methods of unsettled deliveries return
// idem.ErrClosed. It does not close the DB. Closing twice is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	streams := make([]*dbStream, 0, len(t.streams))
	for s := range t.streams {
		streams = append(streams, s)
	}
	t.mu.Unlock()
	var errs []error
	for _, s := range streams {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// Purge deletes at most limit messages of the log that were published
// before olderThan and that every consumer name of their topic has been
// given and has settled, and returns how many it deleted. Call it until it
// returns fewer than limit.
//
// A consumer name that subscribes for the first time after a purge starts
// from the oldest message left, so it does not see the purged ones: keep
// the log as long as a new consumer should be able to read it from the
// start. Returns an error matching idem.ErrInvalidArgument when limit is
// not positive.
func (t *Transport) Purge(ctx context.Context, olderThan time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	var n int64
	err := t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := t.db.in(tx).exec(ctx, sqlPurgeTransport, olderThan.UnixNano(), limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: purge transport: %w", err)
	}
	return int(n), nil
}

// MoveOutbox implements idem.OutboxMover: when ob is an *Outbox of the
// Transport's DB, it moves up to limit of the oldest entries that no relay
// holds under a live lease (judged by the outbox's clock) into the log, in
// the outbox's order, in one write transaction (the one ctx carries, if
// any), and wakes the streams waiting. The moved messages are stored as
// Publish would store them: bytes, headers and time as the outbox has
// them, and the Transport's clock as the publish time, and as the time of a
// message that has none.
//
// On its own, the move's commit is not synced (see withUnsyncedTx): a move
// lost to a power failure loses its deletes with its inserts, so the
// entries are back in the outbox to be moved again, and a consumer's synced
// commit after the move makes the move durable first.
//
// Returns ok=false, having done nothing, for any other outbox; an error
// matching idem.ErrInvalidArgument when limit is below 1 (whatever the
// outbox, ok still telling whether it is one of the Transport's DB), and
// idem.ErrClosed after Close.
func (t *Transport) MoveOutbox(ctx context.Context, ob idem.Outbox, limit int) (moved int, ok bool, err error) {
	o, ok := ob.(*Outbox)
	ok = ok && o != nil && o.db == t.db
	switch {
	case limit < 1:
		return 0, ok, &idem.ArgumentError{Field: "limit", Reason: "must be at least 1"}
	case !ok:
		return 0, false, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, true, err
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return 0, true, idem.ErrClosed
	}
	var n int64
	err = t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		r := t.db.in(tx)
		leaseNow, now := o.clock.Now().UnixNano(), t.clock.Now().UnixNano()
		res, err := r.exec(ctx, sqlMoveOutbox, now, leaseNow, limit)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		res, err = r.exec(ctx, sqlMovedOutbox, leaseNow, limit)
		if err != nil {
			return err
		}
		// Both statements chose the same entries: nothing else writes in
		// between, the transaction holding the file's write lock.
		if d, err := res.RowsAffected(); err != nil {
			return err
		} else if d != n {
			return fmt.Errorf("moved %d entries but deleted %d from the outbox", n, d)
		}
		return nil
	})
	if err != nil {
		return 0, true, fmt.Errorf("idemsqlite: move outbox: %w", err)
	}
	if n > 0 {
		t.signal()
	}
	return int(n), true, nil
}

type dbStream struct {
	t   *Transport
	sub idem.Subscription
	// id names the stream in the owner column of what it holds; tokens
	// number its hand-outs, so a delivery can tell it is stale.
	id     string
	tokens atomic.Int64
	// busy is set when the last take handed a message out.
	busy atomic.Bool

	closeOnce sync.Once
	done      chan struct{}
}

// Next implements idem.Stream.
func (s *dbStream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.next(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

// NextBatch implements idem.BatchStream: up to max of the messages Next
// would hand out one by one, in that order, handed out in one write
// transaction. The subscription's MaxInFlight bounds them as it bounds
// Next. Returns an error matching idem.ErrInvalidArgument when max is below
// 1.
func (s *dbStream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	return s.next(ctx, max)
}

// next waits until it can hand out at least one message, and hands out up
// to max.
func (s *dbStream) next(ctx context.Context, max int) ([]idem.Delivery, error) {
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
		s.t.mu.Lock()
		changed := s.t.changed
		s.t.mu.Unlock()
		ds, err := s.take(ctx, max)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
			if errors.Is(err, idem.ErrClosed) {
				return nil, err
			}
			return nil, fmt.Errorf("idemsqlite: next: %w", err)
		}
		if len(ds) > 0 {
			return ds, nil
		}
		if timer == nil {
			timer = time.NewTimer(s.t.poll)
		} else {
			timer.Reset(s.t.poll)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, idem.ErrClosed
		case <-changed:
		case <-timer.C:
		}
	}
}

// take hands out up to max of the oldest messages the stream may have now,
// or none, in one transaction of at most five statements: the look at the
// consumer name, the messages past its cursor made pending (and the cursor
// moved past them), the hand-out of the oldest visible pending ones, and
// the read of their messages. Pending messages are older than any past the
// cursor, so redeliveries come first, in order, then new messages.
//
// Its commit is not synced: losing a hand-out to a power failure only
// loses an attempt's count, and the messages are handed out again.
func (s *dbStream) take(ctx context.Context, max int) ([]idem.Delivery, error) {
	topic, consumer := s.sub.Topic, s.sub.Consumer
	if !s.busy.Load() && s.t.db.carried(ctx) == nil {
		// An idle stream looks from the read pool, so that polling never
		// queues for the writer while there is nothing to hand out. A busy
		// one, whose last look found a message, spares the extra query.
		var due bool
		if err := s.t.db.onReader().queryRow(ctx, sqlDue, topic, consumer, s.t.clock.Now().UnixNano()).Scan(&due); err != nil {
			return nil, err
		}
		if !due {
			return nil, nil
		}
	}
	var out []idem.Delivery
	err := s.t.db.withHandOutTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		// Looked at with the writer held: a Close that has not closed done
		// yet runs its give-back after this transaction, so nothing is
		// handed out to a closed stream and kept for a whole AckWait.
		select {
		case <-s.done:
			return idem.ErrClosed
		default:
		}
		r := s.t.db.in(tx)
		now := s.t.clock.Now().UnixNano()
		var (
			inFlight, visible int
			cursor            sql.NullInt64
		)
		if err := r.queryRow(ctx, sqlTakeState, topic, consumer, now, max).Scan(&inFlight, &visible, &cursor); err != nil {
			return err
		}
		n := min(max, s.sub.MaxInFlight-inFlight)
		if n <= 0 {
			return nil
		}
		if fresh := n - visible; fresh > 0 && cursor.Valid {
			res, err := r.exec(ctx, sqlTakeFresh, topic, consumer, cursor.Int64, fresh)
			if err != nil {
				return err
			}
			if added, err := res.RowsAffected(); err != nil {
				return err
			} else if added > 0 {
				if _, err := r.exec(ctx, sqlMoveCursor, topic, consumer); err != nil {
					return err
				}
			}
		}
		token := s.tokens.Add(1)
		attempts, err := handOut(ctx, r, now+s.sub.AckWait.Nanoseconds(), s.id, token, topic, consumer, now, n)
		if err != nil || len(attempts) == 0 {
			return err
		}
		seqs := slices.Sorted(maps.Keys(attempts))
		msgs, err := handedOut(ctx, r, seqs)
		if err != nil {
			return err
		}
		out = make([]idem.Delivery, len(seqs))
		for i, seq := range seqs {
			m, ok := msgs[seq]
			if !ok {
				return fmt.Errorf("message %d of the log is missing", seq)
			}
			out[i] = &dbDelivery{s: s, seq: seq, token: token, attempt: attempts[seq], msg: m}
		}
		return nil
	})
	if err != nil {
		s.busy.Store(false)
		return nil, err
	}
	s.busy.Store(len(out) > 0)
	return out, nil
}

// handOut runs sqlHandOut with args and returns the attempt count of each
// message it handed out, by seq.
func handOut(ctx context.Context, r runner, args ...any) (map[int64]int, error) {
	rows, err := r.query(ctx, sqlHandOut, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	attempts := make(map[int64]int)
	for rows.Next() {
		var (
			seq     int64
			attempt int
		)
		if err := rows.Scan(&seq, &attempt); err != nil {
			return nil, err
		}
		attempts[seq] = attempt
	}
	return attempts, rows.Err()
}

// handedOut reads the messages of seqs from the log, by seq.
func handedOut(ctx context.Context, r runner, seqs []int64) (map[int64]idem.Message, error) {
	rows, err := r.query(ctx, sqlHandedOut, jsonInts(seqs))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	msgs := make(map[int64]idem.Message, len(seqs))
	for rows.Next() {
		var (
			seq int64
			m   idem.Message
			h   sql.NullString
			mt  int64
		)
		if err := rows.Scan(&seq, &m.ID, &m.Topic, &m.Key, &h, &m.Payload, &mt); err != nil {
			return nil, err
		}
		if m.Headers, err = decodeHeaders(h); err != nil {
			return nil, err
		}
		m.Time = msgTime(mt)
		msgs[seq] = m
	}
	return msgs, rows.Err()
}

// AckBatch implements idem.BatchStream: one statement deletes the pending
// rows that the deliveries still hold, in the transaction ctx carries if
// any (see AcksInTx) or else in one of its own, not synced, as Ack's. The
// count is of the rows deleted: a delivery that is stale (settled already,
// or handed out again since) is passed over. Returns an error matching
// idem.ErrInvalidArgument when a delivery is not one of this stream's, and
// idem.ErrClosed after the Transport's Close.
func (s *dbStream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(ds) == 0 {
		return 0, nil
	}
	_, pairs, err := s.own(ds)
	if err != nil {
		return 0, err
	}
	t := s.t
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("idemsqlite: ack: %w", idem.ErrClosed)
	}
	var n int64
	err = t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := t.db.in(tx).exec(ctx, sqlAckBatch, s.sub.Topic, s.sub.Consumer, s.id, pairs)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: ack: %w", err)
	}
	if n > 0 {
		// Room under MaxInFlight, for a waiting Next.
		t.signal()
	}
	return int(n), nil
}

// own returns ds as this stream's deliveries and as a JSON array of their
// [seq, token] pairs, or an *idem.ArgumentError naming the first delivery
// that is not one of this stream's.
func (s *dbStream) own(ds []idem.Delivery) ([]*dbDelivery, string, error) {
	own := make([]*dbDelivery, len(ds))
	pairs := make([]byte, 0, 2+len(ds)*16)
	pairs = append(pairs, '[')
	for i, d := range ds {
		dd, ok := d.(*dbDelivery)
		if !ok || dd.s != s {
			return nil, "", &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		if i > 0 {
			pairs = append(pairs, ',')
		}
		pairs = fmt.Appendf(pairs, "[%d,%d]", dd.seq, dd.token)
		own[i] = dd
	}
	return own, string(append(pairs, ']')), nil
}

// InProgressBatch implements idem.BatchRenewer: one statement renews the
// AckWait of every delivery of ds that still holds its message, in the
// transaction ctx carries if any, as InProgress does, or else in one of
// its own, not synced. Returns an error matching idem.ErrInvalidArgument
// when a delivery is not one of this stream's, and idem.ErrClosed after
// the Transport's Close.
func (s *dbStream) InProgressBatch(ctx context.Context, ds []idem.Delivery) ([]int, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	own, pairs, err := s.own(ds)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := s.t
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("idemsqlite: in progress: %w", idem.ErrClosed)
	}
	type held struct{ seq, token int64 }
	var kept map[held]bool
	now := t.clock.Now()
	err = t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		kept = make(map[held]bool, len(ds))
		rows, err := t.db.in(tx).query(ctx, sqlInProgressBatch, s.sub.Topic, s.sub.Consumer, s.id, pairs,
			now.Add(s.sub.AckWait).UnixNano(), now.UnixNano())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var h held
			if err := rows.Scan(&h.seq, &h.token); err != nil {
				return err
			}
			kept[h] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: in progress: %w", err)
	}
	var stale []int
	for i, d := range own {
		if !kept[held{d.seq, d.token}] {
			stale = append(stale, i)
		}
	}
	return stale, nil
}

// AcksInTx implements idem.BatchStream: AckBatch joins the transaction of
// the Transport's DB that ctx carries, when it carries one.
func (s *dbStream) AcksInTx(ctx context.Context) bool {
	return s.t.db.carried(ctx) != nil
}

// Close implements idem.Stream: the messages the stream holds may be
// handed out again at once, to its consumer name's other streams or next
// one.
func (s *dbStream) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.done)
		s.t.mu.Lock()
		delete(s.t.streams, s)
		s.t.mu.Unlock()
		// Ends the stream's AckWaits now, but keeps it as the owner, so a
		// delivery may still be settled until the message goes out again.
		err = s.t.db.withTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := s.t.db.in(tx).exec(ctx, sqlGiveBack, s.t.clock.Now().UnixNano(), s.sub.Topic, s.sub.Consumer, s.id)
			return err
		})
		if err != nil {
			err = fmt.Errorf("idemsqlite: close stream: %w", err)
		}
		s.t.signal()
	})
	return err
}

type dbDelivery struct {
	s       *dbStream
	seq     int64
	token   int64
	attempt int
	msg     idem.Message
}

// Message implements idem.Delivery.
func (d *dbDelivery) Message() idem.Message { return d.msg }

// Attempt implements idem.Delivery: the stored count of hand-outs of the
// message to the consumer name.
func (d *dbDelivery) Attempt() int { return d.attempt }

// Ack implements idem.Delivery, in the transaction ctx carries if any.
func (d *dbDelivery) Ack(ctx context.Context) error {
	return d.update(ctx, "ack", sqlAck)
}

// Term implements idem.Delivery, in the transaction ctx carries if any.
func (d *dbDelivery) Term(ctx context.Context) error {
	return d.update(ctx, "term", sqlAck)
}

// Nack implements idem.Delivery, in the transaction ctx carries if any. A
// negative delay is refused (idem.ValidateNackDelay).
func (d *dbDelivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := idem.ValidateNackDelay(delay); err != nil {
		return err
	}
	at := d.s.t.clock.Now().Add(delay).UnixNano()
	return d.update(ctx, "nack", sqlNack, at)
}

// InProgress implements idem.Delivery: the delivery's AckWait starts
// again. Returns ErrStaleDelivery once the AckWait has ended.
func (d *dbDelivery) InProgress(ctx context.Context) error {
	now := d.s.t.clock.Now()
	return d.update(ctx, "in progress", sqlInProgress, now.Add(d.s.sub.AckWait).UnixNano(), now.UnixNano())
}

// update runs st, one of the settlements, on the message's pending row,
// which it changes only if this delivery still holds it. st's first five
// parameters name the row and the delivery; extra are the rest.
func (d *dbDelivery) update(ctx context.Context, op string, st *statement, extra ...any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := d.s.t
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return fmt.Errorf("idemsqlite: %s: %w", op, idem.ErrClosed)
	}
	args := append([]any{d.seq, d.s.id, d.token, d.s.sub.Topic, d.s.sub.Consumer}, extra...)
	var n int64
	// Not synced: a settlement lost to a power failure brings the message
	// back once more, which delivery at least once allows and the inbox
	// absorbs. Joining the caller's transaction leaves that to its owner.
	err := t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := t.db.in(tx).exec(ctx, st, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("idemsqlite: %s: message %q: %w", op, d.msg.ID, ErrStaleDelivery)
	}
	t.signal()
	return nil
}
