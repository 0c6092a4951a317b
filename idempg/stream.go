package idempg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

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
	rows, err := s.t.db.pool.Query(ctx, s.t.sql.take, s.consumerID, s.t.now(), pgsql.Micros(s.sub.AckWait), s.id, token, int64(limit))
	if err != nil {
		return nil, nil, err
	}
	var (
		ds      []idem.Delivery
		orphans []int64
		seq     int64
		attempt int32
		found   bool
		r       pgsql.MessageRow
	)
	_, err = pgx.ForEachRow(rows, append([]any{&seq, &attempt, &found}, r.Dest()...), func() error {
		if !found {
			orphans = append(orphans, seq)
			return nil
		}
		m, err := r.Message()
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
	seqs, tokens, err := s.own(ds)
	if err != nil {
		return 0, err
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

// own returns the seqs and tokens of ds, or an *idem.ArgumentError naming
// the first delivery that is not one of this stream's.
func (s *pgStream) own(ds []idem.Delivery) (seqs, tokens []int64, err error) {
	seqs, tokens = make([]int64, len(ds)), make([]int64, len(ds))
	for i, d := range ds {
		pd, ok := d.(*pgDelivery)
		if !ok || pd.s != s {
			return nil, nil, &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		seqs[i], tokens[i] = pd.seq, pd.token
	}
	return seqs, tokens, nil
}

// inProgressManySQL is inProgressSQL for many deliveries of the stream $2,
// given as the arrays of their seqs and tokens: it renews the queue rows
// they still hold within their AckWait, and returns the seq and token of
// each it renewed, and of each it passed over, locked by another
// transaction (a settlement in flight, which decides it). It locks in seq
// order and never waits for a lock: a heartbeat that held some rows while
// it waited for another could close a cycle with a transaction that
// settles several of them. $5 turns synchronous_commit off when it commits
// on its own.
const inProgressManySQL = `WITH n AS MATERIALIZED (
	SELECT coalesce($6::timestamptz, clock_timestamp()) AS t,
		CASE WHEN $5::boolean THEN set_config('synchronous_commit', 'off', true) END AS async),
d AS MATERIALIZED (SELECT * FROM unnest($3::bigint[], $4::bigint[]) AS d(seq, token)),
held AS MATERIALIZED (
	SELECT p.seq, p.owner_token AS token FROM n, d, idem_transport_pending AS p
	WHERE p.consumer_id = $1 AND p.seq = d.seq AND p.owner = $2 AND p.owner_token = d.token AND p.visible_at > n.t),
locked AS MATERIALIZED (
	SELECT p.seq FROM idem_transport_pending AS p
	WHERE p.consumer_id = $1 AND p.seq IN (SELECT seq FROM held)
	ORDER BY p.seq FOR UPDATE SKIP LOCKED),
renewed AS (
	UPDATE idem_transport_pending AS p SET visible_at = n.t + $7::bigint * interval '1 microsecond'
	FROM n, d
	WHERE p.consumer_id = $1 AND p.seq IN (SELECT seq FROM locked) AND p.seq = d.seq
		AND p.owner = $2 AND p.owner_token = d.token AND p.visible_at > n.t
	RETURNING p.seq, p.owner_token AS token)
SELECT seq, token FROM renewed
UNION ALL
SELECT seq, token FROM held WHERE seq NOT IN (SELECT seq FROM locked)`

// InProgressBatch implements idem.BatchRenewer: one statement renews the
// AckWait of every delivery of ds that still holds its message, in the
// transaction ctx carries if any, as InProgress does. A delivery whose
// queue row another transaction holds locked (its settlement in flight)
// is passed over, neither renewed nor stale: that settlement decides it.
// Deliveries of another stream are refused with an error matching
// idem.ErrInvalidArgument.
func (s *pgStream) InProgressBatch(ctx context.Context, ds []idem.Delivery) ([]int, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	seqs, tokens, err := s.own(ds)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := s.t
	if t.isClosed() {
		return nil, fmt.Errorf("idempg: in progress: %w", idem.ErrClosed)
	}
	st, err := t.carried(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempg: in progress: %w", err)
	}
	var q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	} = t.db.pool
	if st != nil {
		q = st.tx
	}
	rows, err := q.Query(ctx, t.sql.inProgressMany, s.consumerID, s.id, seqs, tokens, st == nil, t.now(), pgsql.Micros(s.sub.AckWait))
	if err != nil {
		return nil, fmt.Errorf("idempg: in progress: %w", err)
	}
	type held struct{ seq, token int64 }
	kept := make(map[held]bool, len(ds))
	var h held
	_, err = pgx.ForEachRow(rows, []any{&h.seq, &h.token}, func() error {
		kept[h] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: in progress: %w", err)
	}
	var stale []int
	for i, seq := range seqs {
		if !kept[held{seq, tokens[i]}] {
			stale = append(stale, i)
			s.forget(seq, tokens[i])
		}
	}
	return stale, nil
}

// AcksInTx implements idem.BatchStream: AckBatch joins the transaction
// ctx carries when it is one of the Transport's DB.
func (s *pgStream) AcksInTx(ctx context.Context) bool {
	st, err := s.t.carried(ctx)
	return err == nil && st != nil
}
