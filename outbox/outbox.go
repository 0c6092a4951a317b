package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// ErrRunning is returned by Run when the Relay is already running.
var ErrRunning = errors.New("outbox: relay already running")

// Config configures a Relay. Outbox and Publisher are required; every other
// field has a default.
type Config struct {
	// Outbox holds the messages to publish. Required.
	Outbox idem.Outbox
	// Publisher sends them. Required.
	Publisher idem.Publisher
	// Name identifies the relay to the outbox: the holder of its leases.
	// Defaults to "relay-" and 8 random hex digits.
	Name string
	// Batch is how many entries one pass claims and publishes (or moves).
	// Defaults to 500: large enough that a backlog moves in few round
	// trips, small enough that one pass stays short.
	Batch int
	// Lease is how long the claimed entries are the relay's alone. It must
	// exceed the time one batch takes to publish, or another relay may
	// publish the same entries too. Defaults to 30s.
	Lease time.Duration
	// Interval is how long Run waits before looking at the outbox again
	// when a pass found less than a full batch. Wake cuts it short, so it
	// matters only for entries written by processes that cannot wake this
	// relay. Defaults to 1s.
	Interval time.Duration
	// Retry spaces the passes after a failed publish. Its MaxAttempts is
	// ignored: the relay never gives a message up. Defaults to the zero
	// idem.RetryPolicy: full jitter from 100ms, capped at 30s.
	Retry idem.RetryPolicy
	// Timers schedules polls and backoff. Defaults to idem.RuntimeTimers.
	Timers idem.Timers
	// Observer sees every pass that relays something or fails, for
	// tracing and metrics: see packages idemotel and idemprom. Defaults
	// to nil: nothing is observed.
	Observer Observer
	// Logger receives publish failures. Defaults to a logger that
	// discards.
	Logger *slog.Logger
}

// Relay publishes the entries of an outbox, oldest first, and marks them
// sent. The zero Relay is not usable; call New.
type Relay struct {
	cfg     Config
	wake    chan struct{}
	running atomic.Bool

	// mover is the Publisher when it can move the outbox's entries
	// itself (idem.OutboxMover); nil once it said it cannot.
	mover idem.OutboxMover

	// mu serialises passes, and guards the batch a failed pass left.
	mu sync.Mutex
	// pending is the batch claimed and not yet marked sent; published
	// says whether only its MarkSent is left to do.
	pending   []idem.OutboxEntry
	published bool
}

// New returns a Relay for cfg. Returns an error matching
// idem.ErrInvalidArgument when Outbox or Publisher is missing or a field
// is negative.
func New(cfg *Config) (*Relay, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.Outbox == nil:
		return nil, &idem.ArgumentError{Field: "outbox.Config.Outbox", Reason: "must not be nil"}
	case c.Publisher == nil:
		return nil, &idem.ArgumentError{Field: "outbox.Config.Publisher", Reason: "must not be nil"}
	case c.Batch < 0:
		return nil, &idem.ArgumentError{Field: "outbox.Config.Batch", Reason: "must not be negative"}
	case c.Lease < 0:
		return nil, &idem.ArgumentError{Field: "outbox.Config.Lease", Reason: "must not be negative"}
	case c.Interval < 0:
		return nil, &idem.ArgumentError{Field: "outbox.Config.Interval", Reason: "must not be negative"}
	}
	if c.Name == "" {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("outbox: relay name: %w", err)
		}
		c.Name = "relay-" + hex.EncodeToString(b[:])
	}
	if c.Batch == 0 {
		c.Batch = 500
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Timers == nil {
		c.Timers = idem.RuntimeTimers{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	mover, _ := c.Publisher.(idem.OutboxMover)
	return &Relay{cfg: c, wake: make(chan struct{}, 1), mover: mover}, nil
}

// Name returns the relay's name, the holder of its leases.
func (r *Relay) Name() string { return r.cfg.Name }

// Wake makes a running relay look at the outbox at once instead of at its
// next poll: a caller that has just committed entries calls it to cut
// their latency. It never blocks, and is a no-op when the relay is not
// waiting.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Flush makes one pass: it claims up to Batch entries, publishes them in
// order in one Publish call, and marks them sent. It returns how many
// entries it marked sent. When the Publisher is an idem.OutboxMover that
// can take this outbox (a database transport in the outbox's own
// database), the pass is one MoveOutbox instead: claim, publish and mark
// sent in one transaction, so nothing is published twice.
//
// When the publish fails, Flush returns the error and keeps the batch: the
// next pass publishes the same entries again, before claiming any other,
// so that a failure does not reorder the outbox and nothing is dropped. The
// entries' lease may run out meanwhile and another relay publish them too;
// the consumers absorb the duplicate. When only MarkSent fails, the next
// pass retries MarkSent alone.
func (r *Relay) Flush(ctx context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if r.cfg.Observer == nil {
		return r.flush(ctx, nil)
	}
	var p Pass
	start := time.Now()
	n, err := r.flush(ctx, &p)
	p.Sent, p.Err = n, err
	r.observe(ctx, start, p)
	return n, err
}

// flush is Flush's pass, with r.mu held; it fills in p, when not nil,
// with what the observer is told.
func (r *Relay) flush(ctx context.Context, p *Pass) (int, error) {
	if r.mover != nil && len(r.pending) == 0 {
		n, ok, err := r.mover.MoveOutbox(ctx, r.cfg.Outbox, r.cfg.Batch)
		if ok {
			if p != nil {
				p.Moved = true
			}
			if err != nil {
				return 0, fmt.Errorf("outbox relay %s: move: %w", r.cfg.Name, err)
			}
			return n, nil
		}
		// Not an outbox of the publisher's database: relay the long way,
		// from now on.
		r.mover = nil
	}
	if len(r.pending) == 0 {
		entries, err := r.cfg.Outbox.Claim(ctx, r.cfg.Name, r.cfg.Batch, r.cfg.Lease)
		if err != nil {
			return 0, fmt.Errorf("outbox relay %s: claim: %w", r.cfg.Name, err)
		}
		if len(entries) == 0 {
			return 0, nil
		}
		r.pending, r.published = entries, false
	}
	if !r.published {
		msgs := make([]idem.Message, len(r.pending))
		for i, e := range r.pending {
			msgs[i] = e.Message
		}
		if p != nil {
			p.Messages, p.Oldest = msgs, r.pending[0].CreatedAt
		}
		if err := r.cfg.Publisher.Publish(ctx, msgs...); err != nil {
			return 0, fmt.Errorf("outbox relay %s: publish %d messages from seq %d: %w", r.cfg.Name, len(msgs), r.pending[0].Seq, err)
		}
		r.published = true
	}
	seqs := make([]int64, len(r.pending))
	for i, e := range r.pending {
		seqs[i] = e.Seq
	}
	if err := r.cfg.Outbox.MarkSent(ctx, seqs...); err != nil {
		return 0, fmt.Errorf("outbox relay %s: mark %d entries sent: %w", r.cfg.Name, len(seqs), err)
	}
	n := len(r.pending)
	r.pending, r.published = nil, false
	return n, nil
}

// Run relays until ctx is cancelled, then returns nil. A pass that
// published a full batch is followed at once by another; otherwise Run
// waits Interval, or until Wake. A failed pass is logged and tried again
// after the Retry policy's backoff, for as long as it takes. Returns
// ErrRunning when the relay is already running.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	failures := 0
	var prev time.Duration
	for {
		n, err := r.Flush(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err != nil:
			failures++
			wait = r.cfg.Retry.Delay(failures, prev)
			prev = wait
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outbox relay pass failed; retrying",
				slog.String("relay", r.cfg.Name), slog.Int("failures", failures),
				slog.Duration("delay", wait), slog.String("error", err.Error()))
		case n == r.cfg.Batch:
			failures, prev = 0, 0
			continue
		default:
			failures, prev = 0, 0
			wait = r.cfg.Interval
		}
		if !r.sleep(ctx, wait, err == nil) {
			return nil
		}
	}
}

// sleep waits d, or less when woken (only when wakeable: a backoff is not
// cut short by new entries), and reports false when ctx ended.
func (r *Relay) sleep(ctx context.Context, d time.Duration, wakeable bool) bool {
	fired := make(chan struct{})
	stop := r.cfg.Timers.AfterFunc(d, func() { close(fired) })
	defer stop()
	var wake <-chan struct{}
	if wakeable {
		wake = r.wake
	}
	select {
	case <-ctx.Done():
		return false
	case <-fired:
	case <-wake:
	}
	return true
}
