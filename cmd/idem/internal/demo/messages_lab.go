package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// The lab's settings every scenario shares.
const (
	// labAckWait is the transport's ack wait for every subscription: long,
	// so that the consumers' heartbeats (every quarter of it) never come
	// due while the lab's clock runs, and a delivery comes back only when a
	// scenario moves the clock past it on purpose.
	labAckWait = time.Hour
	// wakePoll is how often a waiting stream looks at the database in the
	// scenarios whose deliveries come back when the clock moves (a Nack's
	// delay, an ack wait): the clock moves without telling the transport,
	// so the stream sees it at its next look. idlePoll is the others',
	// whose streams have handed everything out at the start and whose
	// retries wait in the consumer: their looks would find nothing, and
	// each costs a query.
	wakePoll = 5 * time.Millisecond
	idlePoll = time.Second
	// stuckAfter bounds, in real time, every wait for the lab to be quiet:
	// a wait that has not ended by then is a defect (each ends within
	// seconds on a loaded machine under the race detector), reported as an
	// error rather than a hang.
	stuckAfter = 2 * time.Minute
	// labSeed seeds the jitter of idem's retries, so that the full-jitter
	// delays, and every figure drawn from them, are the same every run.
	labSeed = 20251206
)

// labClock is the lab's time: a manual clock that moves only when a
// scenario moves it, so that every figure measured in time (a retry's
// delay, a wait, calls per 100 ms) is the same on every run, however
// loaded the machine. The consumers take it as their Clock and Timers and
// the transport as its Clock.
//
// It counts the timers shorter than labAckWait/4 that are pending: the
// retries a consumer waits for (heartbeats, set for a quarter of the ack
// wait, are not counted). A scenario moves the clock once the lab is
// quiet, each consumer waiting for a counted timer or done, to the next
// counted timer: the same steps on every run.
type labClock struct {
	*idemmem.Clock

	mu      sync.Mutex
	seq     uint64
	pending map[uint64]time.Time // counted timers: when each is due
}

func newLabClock(start time.Time) *labClock {
	return &labClock{Clock: idemmem.NewClock(start), pending: make(map[uint64]time.Time)}
}

var _ idem.Timers = (*labClock)(nil)

// AfterFunc implements idem.Timers, counting the timers shorter than a
// heartbeat's. A timer is set and counted, or the clock moved, under one
// lock, so that a move never falls between the two: the clock cannot
// reach a timer it does not count. A timer for no time at all runs at
// once, uncounted, as work in flight.
func (c *labClock) AfterFunc(d time.Duration, f func()) func() bool {
	if d <= 0 || d >= labAckWait/4 {
		return c.Clock.AfterFunc(d, f)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	id := c.seq
	c.pending[id] = c.Clock.Now().Add(d)
	stop := c.Clock.AfterFunc(d, func() {
		c.forget(id)
		f()
	})
	return func() bool {
		stopped := stop()
		if stopped {
			c.forget(id)
		}
		return stopped
	}
}

// Set moves the clock to t. The counted timers it makes due stop being
// counted before it returns, though they run in goroutines of their own:
// until each has run and its consumer waits again, the lab is not quiet.
func (c *labClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, at := range c.pending {
		if !at.After(t) {
			delete(c.pending, id)
		}
	}
	c.Clock.Set(t)
}

// Advance moves the clock by d, as Set does.
func (c *labClock) Advance(d time.Duration) {
	c.mu.Lock()
	t := c.Clock.Now().Add(d)
	c.mu.Unlock()
	c.Set(t)
}

func (c *labClock) forget(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
}

// waiting counts the counted timers pending.
func (c *labClock) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// next returns when the counted timers due first are due: the earliest,
// or, with a grain, the last due within the grain's window (counted from
// from) that holds the earliest, so that they fire together.
func (c *labClock) next(from time.Time, grain time.Duration) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	for _, t := range c.pending {
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	if at.IsZero() || grain <= 0 {
		return at, !at.IsZero()
	}
	end := from.Add((at.Sub(from)/grain + 1) * grain)
	for _, t := range c.pending {
		if t.After(at) && t.Before(end) {
			at = t
		}
	}
	return at, true
}

// sleep waits for d on the clock (a counted timer), or for ctx.
func (c *labClock) sleep(ctx context.Context, d time.Duration) error {
	woke := make(chan struct{})
	stop := c.AfterFunc(d, func() { close(woke) })
	select {
	case <-woke:
		return nil
	case <-ctx.Done():
		stop()
		return ctx.Err()
	}
}

// run moves the clock from one counted timer to the next, each time quiet
// holds, until done holds or the next timer is due after until. quiet must
// hold only when every consumer of the scenario waits for a counted timer
// or has nothing left to do. With a grain, the timers due within one
// window of it (counted from from) fire together, at the last one's time:
// late, as timers are on a busy machine, never early.
func (c *labClock) run(ctx context.Context, what string, quiet, done func() bool, from time.Time, grain time.Duration, until time.Time) error {
	for {
		if err := waitUntil(ctx, what, quiet); err != nil {
			return err
		}
		if done() {
			return nil
		}
		at, ok := c.next(from, grain)
		if !ok || at.After(until) {
			return nil
		}
		c.Set(at)
	}
}

// waitUntil polls cond, in real time, until it holds. It fails after
// stuckAfter: every wait of the lab ends within milliseconds when the code
// does what it should.
func waitUntil(ctx context.Context, what string, cond func() bool) error {
	deadline := time.Now().Add(stuckAfter)
	for !cond() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the lab got stuck waiting for %s (%v)", what, stuckAfter)
		}
		time.Sleep(200 * time.Microsecond)
	}
	return nil
}

// labRand is the seeded randomness of idem's retries in the lab, safe for
// the consumers' workers to share. It keeps one stream per bound: the
// retries that fire at one instant draw in no particular order, and the
// bound says which attempt a draw is for (full jitter draws below the
// attempt's exponential delay), so that each attempt's delays, and every
// figure drawn from them, are the same on every run whatever that order.
type labRand struct {
	seed    uint64
	mu      sync.Mutex
	streams map[int64]*rand.Rand
}

func newLabRand(seed uint64) *labRand {
	return &labRand{seed: seed, streams: make(map[int64]*rand.Rand)}
}

// Int64N implements idem.Rand.
func (l *labRand) Int64N(n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.streams[n]
	if r == nil {
		r = rand.New(rand.NewPCG(l.seed, uint64(n)))
		l.streams[n] = r
	}
	return r.Int64N(n)
}

// wire sits between a consumer and the lab's transport, the way the
// consumer's tests put a recorder there: it counts what the transport
// delivers and what the consumer settles, and loses the acknowledgements
// loseAck picks, as a network would (the consumer thinks it acknowledged;
// the transport never heard, and delivers the message again after its ack
// wait). Its streams hand out one delivery at a time, so every delivery
// is settled on its own and an acknowledgement can be lost.
type wire struct {
	idem.Subscriber
	// loseAck reports whether to lose the acknowledgement of d. Nil loses
	// none.
	loseAck func(d idem.Delivery) bool

	deliveries, acks, lostAcks, nacks, terms atomic.Int64
}

// Subscribe implements idem.Subscriber. The transport may hand out up to
// 100 deliveries unacknowledged, whatever the consumer asks: a lost
// acknowledgement keeps its delivery in flight until its ack wait ends,
// and must not stop the others.
func (w *wire) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	sub.MaxInFlight = max(sub.MaxInFlight, 100)
	s, err := w.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &wireStream{s: s, w: w}, nil
}

// settled counts the deliveries settled for good: acknowledged (the lost
// acknowledgements included, which the consumer believes made) or
// terminated.
func (w *wire) settled() int64 { return w.acks.Load() + w.lostAcks.Load() + w.terms.Load() }

type wireStream struct {
	s idem.Stream
	w *wire
}

func (s *wireStream) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.s.Next(ctx)
	if err != nil {
		return nil, err
	}
	s.w.deliveries.Add(1)
	return &wireDelivery{Delivery: d, w: s.w}, nil
}

func (s *wireStream) Close() error { return s.s.Close() }

type wireDelivery struct {
	idem.Delivery
	w *wire
}

func (d *wireDelivery) Ack(ctx context.Context) error {
	if d.w.loseAck != nil && d.w.loseAck(d.Delivery) {
		d.w.lostAcks.Add(1)
		return nil
	}
	if err := d.Delivery.Ack(ctx); err != nil {
		return err
	}
	d.w.acks.Add(1)
	return nil
}

func (d *wireDelivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := d.Delivery.Nack(ctx, delay); err != nil {
		return err
	}
	d.w.nacks.Add(1)
	return nil
}

func (d *wireDelivery) Term(ctx context.Context) error {
	if err := d.Delivery.Term(ctx); err != nil {
		return err
	}
	d.w.terms.Add(1)
	return nil
}

// msgLab is the SQLite file every scenario runs on, with the message
// stores of idemsqlite on it. The file is a payment service's database
// (payments.Migrate), so that `idem dlq` and `idem console` read its dead
// letters as they read the service's.
type msgLab struct {
	db      *idemsqlite.DB
	inbox   *idemsqlite.Inbox
	letters *idemsqlite.DeadLetters
	ledger  *idemsqlite.Ledger
	start   time.Time
	// logger is the consumers' Logger.
	logger *slog.Logger
}

// The demo's own tables: what the scenarios' handlers write, each row
// under the name of the run that wrote it.
const labSchema = `
CREATE TABLE IF NOT EXISTS demo_totals (
	run     TEXT PRIMARY KEY,
	total   INTEGER NOT NULL,
	applied INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS demo_applied (
	run        TEXT NOT NULL,
	event      TEXT NOT NULL,
	published  INTEGER NOT NULL,
	applied_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS demo_accounts (
	run     TEXT NOT NULL,
	account TEXT NOT NULL,
	balance INTEGER NOT NULL,
	status  TEXT NOT NULL,
	PRIMARY KEY (run, account)
);
CREATE TABLE IF NOT EXISTS demo_history (
	run     TEXT NOT NULL,
	account TEXT NOT NULL,
	step    INTEGER NOT NULL,
	balance INTEGER NOT NULL,
	status  TEXT NOT NULL,
	kind    TEXT NOT NULL,
	PRIMARY KEY (run, account, step)
);`

func openMsgLab(ctx context.Context, path string, start time.Time, logger *slog.Logger) (_ *msgLab, err error) {
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		return nil, fmt.Errorf("opening the lab's database: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, db.Close())
		}
	}()
	if err := payments.Migrate(ctx, db); err != nil {
		return nil, fmt.Errorf("migrating the lab's database: %w", err)
	}
	if err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, labSchema)
		return err
	}); err != nil {
		return nil, fmt.Errorf("creating the lab's tables: %w", err)
	}
	l := &msgLab{db: db, start: start, logger: logger}
	if l.inbox, err = idemsqlite.NewInbox(ctx, db); err != nil {
		return nil, err
	}
	if l.letters, err = idemsqlite.NewDeadLetters(ctx, db, nil); err != nil {
		return nil, err
	}
	if l.ledger, err = idemsqlite.NewLedger(ctx, db); err != nil {
		return nil, err
	}
	return l, nil
}

// transport opens a transport on the lab's file that runs on clock, its
// streams looking at the database every poll while they wait.
func (l *msgLab) transport(ctx context.Context, clock idem.Clock, poll time.Duration) (*idemsqlite.Transport, error) {
	return idemsqlite.NewTransport(ctx, l.db, &idemsqlite.TransportConfig{Clock: clock, AckWait: labAckWait, Poll: poll})
}

// lettersOn returns the lab's dead letters dating their history by clock,
// so that a letter's events and its attempts read on one time line.
func (l *msgLab) lettersOn(ctx context.Context, clock idem.Clock) (*idemsqlite.DeadLetters, error) {
	return idemsqlite.NewDeadLetters(ctx, l.db, &idemsqlite.DeadLettersConfig{Clock: clock})
}

// inTx is consumer.Config.InTx on the lab's file.
func (l *msgLab) inTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return l.db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
}

// exec runs one statement in the transaction ctx carries (the inbox's,
// when a handler calls it), or in one of its own.
func (l *msgLab) exec(ctx context.Context, query string, args ...any) error {
	return l.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	})
}

// labTime is a time of the lab's clock as the demo's tables keep it.
func labTime(t time.Time) int64 { return t.UnixNano() }

// runConsumer runs run in a goroutine until stop is called, which waits
// for it and returns its error; calling stop again returns it again.
func runConsumer(ctx context.Context, run func(ctx context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
}
