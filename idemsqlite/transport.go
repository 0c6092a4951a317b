package idemsqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
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
var ErrStaleDelivery = errors.New("idemsqlite: delivery already settled or handed out again")

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
	// another process. A Publish through the same Transport wakes it at
	// once. Defaults to 50ms.
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
	_ idem.Publisher  = (*Transport)(nil)
	_ idem.Subscriber = (*Transport)(nil)
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
		c.Poll = 50 * time.Millisecond
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
		for _, m := range msgs {
			if m.Time.IsZero() {
				m.Time = now
			}
			h, err := encodeHeaders(m.Headers)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO idem_transport_messages (topic, id, key, headers, payload, msg_time, published_at)
				VALUES (?, ?, ?, ?, ?, ?, ?)`, m.Topic, m.ID, m.Key, h, payloadArg(m.Payload), msgNanos(m.Time), now.UnixNano()); err != nil {
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
	switch {
	case sub.Topic == "":
		return nil, &idem.ArgumentError{Field: "Subscription.Topic", Reason: "must not be empty"}
	case sub.Consumer == "":
		return nil, &idem.ArgumentError{Field: "Subscription.Consumer", Reason: "must not be empty"}
	case sub.AckWait < 0:
		return nil, &idem.ArgumentError{Field: "Subscription.AckWait", Reason: "must not be negative"}
	case sub.MaxInFlight < 0:
		return nil, &idem.ArgumentError{Field: "Subscription.MaxInFlight", Reason: "must not be negative"}
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
		_, err := tx.ExecContext(ctx, `INSERT INTO idem_transport_consumers (topic, consumer, cursor) VALUES (?, ?, 0)
			ON CONFLICT (topic, consumer) DO NOTHING`, sub.Topic, sub.Consumer)
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
		res, err := tx.ExecContext(ctx, `DELETE FROM idem_transport_messages WHERE seq IN (
			SELECT m.seq FROM idem_transport_messages m
			WHERE m.published_at < ?
			  AND NOT EXISTS (SELECT 1 FROM idem_transport_consumers c WHERE c.topic = m.topic AND c.cursor < m.seq)
			  AND NOT EXISTS (SELECT 1 FROM idem_transport_pending p WHERE p.seq = m.seq)
			ORDER BY m.seq LIMIT ?)`, olderThan.UnixNano(), limit)
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

type dbStream struct {
	t   *Transport
	sub idem.Subscription
	// id names the stream in the owner column of what it holds; tokens
	// number its deliveries, so a delivery can tell it is stale.
	id     string
	tokens atomic.Int64
	// busy is set when the last take handed a message out.
	busy atomic.Bool

	closeOnce sync.Once
	done      chan struct{}
}

// Next implements idem.Stream.
func (s *dbStream) Next(ctx context.Context) (idem.Delivery, error) {
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
		d, err := s.take(ctx)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return nil, cerr
			}
			if errors.Is(err, idem.ErrClosed) {
				return nil, err
			}
			return nil, fmt.Errorf("idemsqlite: next: %w", err)
		}
		if d != nil {
			return d, nil
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

// take hands out the oldest message the stream may have now, or returns
// nil. Its commit is not synced: losing a hand-out to a power failure only
// loses an attempt's count, and the message is handed out again.
func (s *dbStream) take(ctx context.Context) (*dbDelivery, error) {
	var d *dbDelivery
	topic, consumer := s.sub.Topic, s.sub.Consumer
	if !s.busy.Load() && s.t.db.carried(ctx) == nil {
		// An idle stream looks from the read pool, so that polling never
		// queues for the writer while there is nothing to hand out. A busy
		// one, whose last look found a message, spares the extra query.
		var due bool
		if err := s.t.db.reader.QueryRowContext(ctx, `SELECT
			EXISTS (SELECT 1 FROM idem_transport_pending WHERE topic = ? AND consumer = ? AND visible_at <= ?)
			OR EXISTS (SELECT 1 FROM idem_transport_messages m, idem_transport_consumers c
				WHERE c.topic = ? AND c.consumer = ? AND m.topic = c.topic AND m.seq > c.cursor)`,
			topic, consumer, s.t.clock.Now().UnixNano(), topic, consumer).Scan(&due); err != nil {
			return nil, err
		}
		if !due {
			return nil, nil
		}
	}
	err := s.t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		// Looked at with the writer held: a Close that has not closed done
		// yet runs its give-back after this transaction, so nothing is
		// handed out to a closed stream and kept for a whole AckWait.
		select {
		case <-s.done:
			return idem.ErrClosed
		default:
		}
		now := s.t.clock.Now()
		var inFlight int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM idem_transport_pending
			WHERE topic = ? AND consumer = ? AND owner IS NOT NULL AND visible_at > ?`,
			topic, consumer, now.UnixNano()).Scan(&inFlight); err != nil {
			return err
		}
		if inFlight >= s.sub.MaxInFlight {
			return nil
		}
		best := int64(-1)
		err := tx.QueryRowContext(ctx, `SELECT seq FROM idem_transport_pending
			WHERE topic = ? AND consumer = ? AND visible_at <= ? ORDER BY seq LIMIT 1`,
			topic, consumer, now.UnixNano()).Scan(&best)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var fresh int64
		err = tx.QueryRowContext(ctx, `SELECT m.seq FROM idem_transport_messages m, idem_transport_consumers c
			WHERE c.topic = ? AND c.consumer = ? AND m.topic = c.topic AND m.seq > c.cursor ORDER BY m.seq LIMIT 1`,
			topic, consumer).Scan(&fresh)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case best < 0 || fresh < best:
			if _, err := tx.ExecContext(ctx, `INSERT INTO idem_transport_pending (topic, consumer, seq, attempts, visible_at)
				VALUES (?, ?, ?, 0, 0)`, topic, consumer, fresh); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE idem_transport_consumers SET cursor = ? WHERE topic = ? AND consumer = ?`,
				fresh, topic, consumer); err != nil {
				return err
			}
			best = fresh
		}
		if best < 0 {
			return nil
		}
		token := s.tokens.Add(1)
		var attempt int
		if err := tx.QueryRowContext(ctx, `UPDATE idem_transport_pending
			SET attempts = attempts + 1, visible_at = ?, owner = ?, owner_token = ?
			WHERE topic = ? AND consumer = ? AND seq = ? RETURNING attempts`,
			now.Add(s.sub.AckWait).UnixNano(), s.id, token, topic, consumer, best).Scan(&attempt); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, topic, key, headers, payload, msg_time FROM idem_transport_messages
			WHERE seq = ?`, best)
		if err != nil {
			return err
		}
		msgs, err := scanMessages(rows)
		if err != nil {
			return err
		}
		if len(msgs) != 1 {
			return fmt.Errorf("message %d of the log is missing", best)
		}
		d = &dbDelivery{s: s, seq: best, token: token, attempt: attempt, msg: msgs[0]}
		return nil
	})
	s.busy.Store(d != nil)
	return d, err
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
			now := s.t.clock.Now().UnixNano()
			_, err := tx.ExecContext(ctx, `UPDATE idem_transport_pending SET visible_at = ?
				WHERE topic = ? AND consumer = ? AND owner = ? AND visible_at > ?`,
				now, s.sub.Topic, s.sub.Consumer, s.id, now)
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
	return d.update(ctx, "ack", false, `DELETE FROM idem_transport_pending`, nil)
}

// Term implements idem.Delivery, in the transaction ctx carries if any.
func (d *dbDelivery) Term(ctx context.Context) error {
	return d.update(ctx, "term", false, `DELETE FROM idem_transport_pending`, nil)
}

// Nack implements idem.Delivery, in the transaction ctx carries if any. A
// negative delay counts as zero.
func (d *dbDelivery) Nack(ctx context.Context, delay time.Duration) error {
	at := d.s.t.clock.Now().Add(max(delay, 0)).UnixNano()
	return d.update(ctx, "nack", false,
		`UPDATE idem_transport_pending SET visible_at = ?, owner = NULL, owner_token = NULL`, []any{at})
}

// InProgress implements idem.Delivery: the delivery's AckWait starts
// again. Returns ErrStaleDelivery once the AckWait has ended.
func (d *dbDelivery) InProgress(ctx context.Context) error {
	at := d.s.t.clock.Now().Add(d.s.sub.AckWait).UnixNano()
	return d.update(ctx, "in progress", true, `UPDATE idem_transport_pending SET visible_at = ?`, []any{at})
}

// update runs stmt (a DELETE or UPDATE of the message's pending row,
// without its WHERE) on the row only if this delivery still holds it.
func (d *dbDelivery) update(ctx context.Context, op string, live bool, stmt string, args []any) error {
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
	now := t.clock.Now().UnixNano()
	where := ` WHERE topic = ? AND consumer = ? AND seq = ? AND owner = ? AND owner_token = ?`
	args = append(args, d.s.sub.Topic, d.s.sub.Consumer, d.seq, d.s.id, d.token)
	if live {
		where += ` AND visible_at > ?`
		args = append(args, now)
	}
	var n int64
	// Not synced: a settlement lost to a power failure brings the message
	// back once more, which delivery at least once allows and the inbox
	// absorbs. Joining the caller's transaction leaves that to its owner.
	err := t.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, stmt+where, args...)
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
