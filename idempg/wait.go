package idempg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// errClosed is returned by WaitChange once the store is closed.
var errClosed = errors.New("idempg: store closed")

// Reconnection backoff of the LISTEN connection: doubling from the first to
// the last, reset once a connection listens again.
const (
	minReconnectDelay = 50 * time.Millisecond
	maxReconnectDelay = 5 * time.Second
)

// listener keeps one connection LISTENing on the store's channel and wakes
// the local waiters of the keys whose ids arrive. It starts with the first
// WaitChange, so a process that never waits holds no extra connection.
type listener struct {
	db      *DB
	channel string

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returns
	stop    chan struct{} // closed by close

	// onListen, when set (by tests), is called each time a connection has
	// started listening, after waking every waiter, with the backend's pid.
	onListen func(pid uint32)
}

func newListener(db *DB, channel string) *listener {
	return &listener{
		db:      db,
		channel: channel,
		waiters: make(map[string]map[chan struct{}]struct{}),
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
	}
}

// register adds a waiter for id, starting the listener if needed. The
// returned channel is closed when the key may have changed; unregister
// must be called when the waiter stops waiting.
func (l *listener) register(id string) (ch chan struct{}, unregister func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, errClosed
	}
	if !l.started {
		l.started = true
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel = cancel
		go l.run(ctx)
	}
	ch = make(chan struct{})
	set := l.waiters[id]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		l.waiters[id] = set
	}
	set[ch] = struct{}{}
	return ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if set, ok := l.waiters[id]; ok {
			delete(set, ch)
			if len(set) == 0 {
				delete(l.waiters, id)
			}
		}
	}, nil
}

// wake wakes the waiters of id.
func (l *listener) wake(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.waiters[id] {
		close(ch)
	}
	delete(l.waiters, id)
}

// wakeAll wakes every waiter: used when notifications may have been missed.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, set := range l.waiters {
		for ch := range set {
			close(ch)
		}
		delete(l.waiters, id)
	}
}

func (l *listener) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.stop)
	started := l.started
	if started {
		l.cancel()
	}
	l.mu.Unlock()
	if started {
		<-l.done
	}
}

// run listens until ctx is cancelled, reconnecting with backoff whenever the
// connection fails.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	delay := minReconnectDelay
	for {
		listened := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		// Notifications sent while no connection listens are lost: let
		// every waiter look again rather than sleep through a change.
		l.wakeAll()
		if listened {
			delay = minReconnectDelay
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, maxReconnectDelay)
	}
}

// listen connects, LISTENs and delivers notifications until the connection
// fails or ctx is cancelled. It reports whether it got to LISTEN.
func (l *listener) listen(ctx context.Context) (listened bool) {
	conn, err := pgx.ConnectConfig(ctx, l.db.pool.Config().ConnConfig)
	if err != nil {
		return false
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(l.channel)); err != nil {
		return false
	}
	// From here on every change is notified; any change before it is
	// covered by waking everyone now, after which each waiter reads the
	// record again.
	l.wakeAll()
	if l.onListen != nil {
		l.onListen(conn.PgConn().PID())
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true
		}
		l.wake(n.Payload)
	}
}

// registerSQL registers a waiter of a key in flight under a live lease
// (see WaitChange), until that lease ends. Its command tag counts the rows
// registered: none when the key is not in flight.
const registerSQL = `INSERT INTO idem_waiters (scope, key, waiter, until)
	SELECT k.scope, k.key, $3, k.lease_expires_at
	FROM idem_keys AS k, (SELECT coalesce($4::timestamptz, clock_timestamp()) AS t) AS n
	WHERE k.scope = $1 AND k.key = $2 AND k.state = 'in_flight' AND k.lease_expires_at > n.t
	ON CONFLICT DO NOTHING`

// unregisterSQL removes a waiter's registration.
const unregisterSQL = `DELETE FROM idem_waiters WHERE scope = $1 AND key = $2 AND waiter = $3`

// unregisterTimeout bounds the removal of a registration, which runs even
// when the waiter's context is done.
const unregisterTimeout = 5 * time.Second

// waitSQL tells whether the key is in flight under a live lease (so waiting
// makes sense) and how long, in microseconds, until that lease ends.
const waitSQL = `SELECT state = 'in_flight' AND lease_expires_at > n.t,
	(extract(epoch FROM lease_expires_at - n.t) * 1000000)::bigint
	FROM idem_keys, (SELECT coalesce($3::timestamptz, clock_timestamp()) AS t) AS n
	WHERE scope = $1 AND key = $2`

// WaitChange implements idem.Waiter with PostgreSQL's LISTEN/NOTIFY.
// Complete, Release, CompleteTx and takeovers notify the channel
// "<schema>_idem_keys" with a short hash of the scope and key, so a waiter on
// any replica wakes when the change commits.
//
// WaitChange returns at once when the key is not in flight under a live
// lease (absent, completed, or claimable by takeover), since a Claim would
// then make progress. Otherwise it returns when a notification for the key
// arrives, when the lease ends (by the store's clock), after the LISTEN
// connection was lost and re-established (notifications may have been missed
// meanwhile), or when ctx is done (returning ctx.Err()). After Close it
// returns an error.
//
// Completions and releases notify only the keys that have waiters, so that
// the commits of all the others never take the database-wide lock a NOTIFY
// holds through its commit. A waiter therefore registers, in one round trip:
// a transaction inserts its row in the unlogged table idem_waiters and
// commits, then a statement of its own reads the key. A completion or
// release looks for waiters after its own commit, in a statement of its own
// sent in the same pipeline. So whichever comes first, nothing is missed: a
// registration committed before that look is seen and notified, and a
// registration committed after it is followed by a read that sees the
// change, whatever the transactions' isolation levels. The row is deleted
// when the waiter returns; Purge deletes rows a process that died while
// waiting left behind, once the lease they waited for has ended.
//
// The store keeps one dedicated LISTEN connection, opened by the first
// WaitChange, besides the pool. It does not work through a connection pooler
// in transaction mode (PgBouncer), which cannot keep a LISTEN.
func (s *Store) WaitChange(ctx context.Context, scope idem.Scope, key idem.Key) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Listened for before registering, so that a change notified after the
	// registration is never missed.
	changed, unregister, err := s.waits.register(pgsql.NotifyID(scope, key))
	if err != nil {
		return err
	}
	defer unregister()

	waiter := rand.Int64()
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(registerSQL, string(scope), string(key), waiter, s.db.now())
	b.Queue("commit")
	b.Queue(waitSQL, string(scope), string(key), s.db.now())
	var (
		registered, wait bool
		left             int64
	)
	res := s.db.pool.SendBatch(ctx, b)
	err = func() error {
		if _, err := res.Exec(); err != nil {
			return err
		}
		tag, err := res.Exec()
		if err != nil {
			return err
		}
		registered = tag.RowsAffected() == 1
		if _, err := res.Exec(); err != nil {
			return err
		}
		return res.QueryRow().Scan(&wait, &left)
	}()
	if cerr := res.Close(); err == nil && !errors.Is(cerr, pgx.ErrNoRows) {
		err = cerr
	}
	if registered {
		// Also after a failure: the registration may have committed.
		defer func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unregisterTimeout)
			defer cancel()
			s.db.pool.Exec(ctx, unregisterSQL, string(scope), string(key), waiter)
		}()
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("idempg: wait: %w", err)
	}
	// Not registered: the key was not in flight when the registration
	// looked. Claiming again tells what it is now.
	if !wait || !registered {
		return nil
	}
	timer := time.NewTimer(time.Duration(left) * time.Microsecond)
	defer timer.Stop()
	select {
	case <-changed:
		return nil
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.waits.stop:
		return errClosed
	}
}
