package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Handler applies one message. It runs inside the inbox's transaction: ctx
// carries it (each inbox documents how to reach it), so the handler's writes
// and the inbox row commit together, or not at all.
//
// Return nil when the message is applied, idem.Permanent(err) when it can
// never be (malformed, the data it refers to is gone), idem.RetryAfter(err,
// d) to be retried after d, and any other error to be retried with the
// policy's backoff. A panic is recovered and counts as a transient failure.
type Handler func(ctx context.Context, m idem.Message) error

// OrderPolicy says what happens to the later messages of a key once one of
// its messages has been dead-lettered.
type OrderPolicy int

const (
	// Park holds the key back: its later messages are parked in the Ledger,
	// in order, until the dead letter is re-driven or discarded and the key
	// is let go. Applying them past the failed one would break the order the
	// key stands for.
	Park OrderPolicy = iota
	// LetThrough applies the later messages as if the dead-lettered one had
	// not been there. For keys whose messages carry the final state, where
	// order does not change the outcome.
	LetThrough
)

func (p OrderPolicy) String() string {
	switch p {
	case Park:
		return "park"
	case LetThrough:
		return "let-through"
	}
	return fmt.Sprintf("OrderPolicy(%d)", int(p))
}

// Config configures a Consumer. Name, Topic, Subscriber, Inbox, DeadLetters
// and Ledger are required; every other field has a default.
type Config struct {
	// Name is the consumer's name: its durable subscription, and the
	// namespace of its inbox rows, ledger entries and dead letters.
	// Required.
	Name string
	// Topic is what to consume. Required.
	Topic string

	// Subscriber delivers the topic's messages. Required.
	Subscriber idem.Subscriber
	// Inbox de-duplicates the messages, in the database the handler writes
	// to. Required: NoInbox, which de-duplicates nothing, says so where
	// the handler's effect is idempotent by itself.
	Inbox idem.Inbox
	// DeadLetters keeps the messages that failed for good. Required.
	DeadLetters idem.DeadLetters
	// Ledger keeps failed attempts across restarts and the keys held back
	// behind a dead letter. Required.
	Ledger idem.Ledger

	// DedupKey derives the key the inbox de-duplicates by, such as an event
	// ID in the payload, so that a copy re-published under another message
	// ID is still caught. An error, a panic or an empty key means the
	// message is malformed: it is dead-lettered at once as permanent.
	// Defaults to the message ID. With Sequence set, the inbox
	// de-duplicates by aggregate and sequence number instead, and the dedup
	// key still names the message in the Ledger (its recorded attempts)
	// and in Info.
	DedupKey func(idem.Message) (string, error)

	// Sequence derives the aggregate a message is about and its sequence
	// number within that aggregate (1, 2, 3, …), such as an account ID and
	// the account's event version from the payload. When set, the consumer
	// de-duplicates by them (idem.SequenceInbox.ProcessSequence, so Inbox
	// must be one): the inbox keeps one mark per aggregate, the highest
	// number applied, and a message at or below its aggregate's mark is a
	// duplicate whatever its message ID, so an event re-published under a
	// new ID is caught too. Gap says what happens to a number that skips
	// past the next. An error, a panic, an empty aggregate or the number 0
	// means the message is malformed: it is dead-lettered at once as
	// permanent. Messages are then handled one at a time (see BatchSize).
	// Defaults to nil: de-duplication by DedupKey.
	Sequence func(idem.Message) (aggregate string, seq uint64, err error)

	// Gap says, when Sequence is set, what happens to a message whose
	// sequence number skips past its aggregate's next one. Under
	// idem.GapHold it is retried with the policy's backoff, as a transient
	// failure, until the missing messages have been applied, and
	// dead-lettered as exhausted if they are not within Retry.MaxAttempts;
	// while it waits it is handed back to the transport (Nack with the
	// delay), even when it has a Key, so that the messages of its key that
	// close the gap can pass it. Under idem.GapAllow it is applied, and the
	// missing messages, should they come later, are duplicates. Defaults
	// to idem.GapHold.
	Gap idem.GapPolicy

	// Retry bounds and spaces the attempts of failing messages. Defaults to
	// the zero idem.RetryPolicy: 10 attempts, full jitter from 100ms, capped
	// at 30s. Attempts are numbered as Info.Attempt says: a redelivery
	// that only replaced a delivery the consumer held without attempting
	// it (its AckWait lapsed while it waited behind its key, the heartbeat
	// late) takes no attempt of the budget.
	Retry idem.RetryPolicy

	// MaxDeliveries bounds how often the transport may deliver one message
	// (its Attempt, the broker's own count) before the consumer gives up
	// on it without running the handler: it is dead-lettered as exhausted,
	// its reason saying it was delivered that often with no outcome
	// recorded. A message whose handling kills the process (a crash, an
	// out-of-memory kill) never records a failure, so without this bound
	// it would come back for good, or until the broker drops it (RabbitMQ
	// 4 drops a quorum queue's message after 20 deliveries unless told
	// where to put it). Transports may count a delivery that only reached
	// a client's buffer before a restart, so it is kept above
	// Retry.MaxAttempts. A message past the bound that its inbox has seen
	// (a copy redelivered while an earlier one was handled slowly) is
	// acknowledged as a duplicate instead.
	//
	// The lapses the consumer causes itself do not count: a delivery it
	// held without attempting it (queued behind its key, or waiting for a
	// retry whose failure the Ledger recorded) whose AckWait ended, the
	// heartbeat late on a loaded machine, and that it let go for the later
	// delivery it held behind it (see the package doc), is subtracted from
	// the later delivery's count, once per such delivery, not by the
	// difference of the counts. Everything else counts: a delivery whose
	// attempt outlasted the AckWait and was let go unrecorded, one that
	// went to another holder, one handed back, and every delivery before a
	// restart, since the consumer cannot tell those lapses from crashes.
	// Defaults to Retry.MaxAttempts + 5 (15 with the default policy); it
	// must not be below Retry.MaxAttempts; negative turns it off.
	MaxDeliveries int

	// AfterDeadLetter says what happens to a key's later messages once one
	// of its messages is dead-lettered. Defaults to Park.
	AfterDeadLetter OrderPolicy

	// Unordered handles messages that have a Key as those without one: no
	// per-key order. A key's messages may then be handled at once, in
	// batches side by side, and a message that failed is handed back to
	// the transport with its delay (Nack), so that the later messages of
	// its key overtake it; a dead letter holds no key back, whatever
	// AfterDeadLetter says. For consumers whose messages carry the final
	// state with a version (Sequence with idem.GapAllow: a message older
	// than what was applied is a duplicate), where the order of arrival
	// does not change the outcome and waiting behind a key only costs
	// time. An effect that adds, or that sets a state without a version,
	// needs the order: see the package documentation, "Order". Defaults
	// to false: a key's messages are handled one at a time, in order.
	Unordered bool

	// Concurrency is how many messages are handled at once. Messages of
	// one key are always handled one at a time, in order. Defaults to 4.
	Concurrency int

	// MaxPending bounds the deliveries held in memory at once: being
	// handled, queued behind an earlier message of their key, or waiting
	// for a retry. When it is reached the consumer stops taking deliveries
	// from the transport until one is settled. It is also the
	// subscription's MaxInFlight. Defaults to Concurrency times the larger
	// of 64 and twice BatchSize.
	MaxPending int

	// BatchSize is the most messages handled in one transaction of the
	// inbox, when the inbox can record many at once (idem.BatchInbox):
	// their inbox rows, their handlers' writes and, on a database transport
	// in the inbox's own database, their acknowledgements commit with one
	// commit. A message that fails does not take its batch-mates with it:
	// the batch is rolled back and tried again without it, while it is
	// retried or dead-lettered on its own. It is also how many deliveries
	// the consumer asks a transport for at once (idem.BatchStream). 1
	// handles every message in a transaction of its own. When Sequence is
	// set, messages are handled one at a time whatever BatchSize says
	// (deliveries are still taken BatchSize at a time): each needs its own
	// look at its aggregate's mark, in its own transaction, and the next
	// message of an aggregate must see the mark the previous one left.
	// Defaults to 100.
	BatchSize int

	// BatchWait is how long a batch with fewer than BatchSize messages
	// waits for more before it is handled. Defaults to 0: a batch holds
	// what is ready at once, so a lone message is handled without delay,
	// and under load batches fill by themselves while earlier ones commit.
	BatchWait time.Duration

	// AckWait is how long the transport waits for a settlement before it
	// delivers a message again. The consumer calls InProgress on the
	// deliveries it holds (queued behind their key, waiting for a retry, or
	// in a long handler) every quarter of it, so that they are not
	// delivered again meanwhile. Defaults to 30s.
	AckWait time.Duration

	// InTx runs fn in one transaction of the database the DeadLetters and
	// Ledger live in, passing fn a context that carries it, so that a dead
	// letter, the hold on its key and the removal of its attempts commit
	// together. With idemsqlite, wrap DB.WithTx. Defaults to calling fn
	// with ctx: each store call then commits on its own, and a crash
	// between them can leave a message dead-lettered twice.
	InTx func(ctx context.Context, fn func(ctx context.Context) error) error

	// Resubscribe spaces Run's attempts to subscribe again after the
	// transport failed (a broker restarting, a database unreachable). Its
	// MaxAttempts is ignored: Run keeps trying until its context ends.
	// Defaults to the zero idem.RetryPolicy: full jitter from 100ms, capped
	// at 30s.
	Resubscribe idem.RetryPolicy

	// Clock dates attempts and heartbeats. Defaults to idem.SystemClock.
	Clock idem.Clock
	// Timers schedules retries and heartbeats; set it with Clock. Defaults
	// to idem.RuntimeTimers.
	Timers idem.Timers
	// Observer sees the handling of every delivery and its outcome, for
	// tracing and latency histograms: see package idemotel for
	// OpenTelemetry spans and idemprom for Prometheus histograms, and
	// Observers to have both. Defaults to nil: nothing is observed.
	Observer Observer
	// Logger receives failures, dead letters and settlement errors.
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

// Stats counts what a Consumer did, since it was created. A message is
// counted once what was done with it is settled: its delivery acknowledged
// or terminated, its retry handed back to the transport or scheduled (a
// settlement that fails is logged, and counted too). Whoever reads a count
// and then looks at
// the transport finds it told. The other way round does not hold: a
// transport may show a message acknowledged an instant before it is
// counted, so a test waits on the count, not on the transport.
type Stats struct {
	// Processed counts messages whose handler succeeded and committed.
	Processed int64
	// Duplicates counts deliveries the inbox had already processed: they
	// were acknowledged without running the handler.
	Duplicates int64
	// Retried counts failed attempts that were scheduled to be retried,
	// messages held for a gap in their aggregate's sequence among them.
	Retried int64
	// DeadLettered counts messages moved to the dead letters.
	DeadLettered int64
	// Parked counts messages parked behind a dead letter of their key.
	Parked int64
	// Stale counts deliveries let go because they were no longer the
	// consumer's own when it was about to retry or dead-letter them (their
	// AckWait or lease ended, their partition was taken away): the
	// message's new holder applies it, so it is neither retried here nor
	// dead-lettered nor parked. It also counts deliveries the heartbeat
	// found no longer the consumer's own that were let go unhandled once
	// at the head of their key, a later delivery of their message held
	// behind them: that later delivery is handled instead.
	Stale int64
}

// ErrRunning is returned by Run when the Consumer is already running.
var ErrRunning = errors.New("consumer: already running")

// ErrPanic is matched (with errors.Is) by the error a panicking handler
// leaves; the attempt counts as a transient failure.
var ErrPanic = errors.New("consumer: handler panicked")

// Consumer applies a topic's messages exactly once, in order per key, with
// retries and dead letters. Create it with New, start it with Run.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	running atomic.Bool
	// subscribed is closed, once, by the first subscription that succeeds.
	subscribed     chan struct{}
	subscribedOnce sync.Once

	processed, duplicates, retried, deadLettered, parked, stale atomic.Int64
}

// New applies the defaults to cfg, validates it and returns a Consumer.
// A missing or malformed field is an *idem.ArgumentError.
func New(cfg *Config) (*Consumer, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := *cfg
	required := []struct {
		field string
		ok    bool
	}{
		{"Name", c.Name != ""},
		{"Topic", c.Topic != ""},
		{"Subscriber", c.Subscriber != nil},
		{"Inbox", c.Inbox != nil},
		{"DeadLetters", c.DeadLetters != nil},
		{"Ledger", c.Ledger != nil},
	}
	for _, r := range required {
		if !r.ok {
			return nil, &idem.ArgumentError{Field: "consumer.Config." + r.field, Reason: "is required"}
		}
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.MaxPending == 0 {
		c.MaxPending = max(64, 2*c.BatchSize) * max(c.Concurrency, 1)
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	switch {
	case c.Concurrency < 0:
		return nil, &idem.ArgumentError{Field: "consumer.Config.Concurrency", Reason: "must not be negative"}
	case c.MaxPending < c.Concurrency:
		return nil, &idem.ArgumentError{Field: "consumer.Config.MaxPending", Reason: fmt.Sprintf("must be at least Concurrency (%d)", c.Concurrency)}
	case c.AckWait < 0:
		return nil, &idem.ArgumentError{Field: "consumer.Config.AckWait", Reason: "must not be negative"}
	case c.BatchSize < 0:
		return nil, &idem.ArgumentError{Field: "consumer.Config.BatchSize", Reason: "must not be negative"}
	case c.BatchWait < 0:
		return nil, &idem.ArgumentError{Field: "consumer.Config.BatchWait", Reason: "must not be negative"}
	case c.AfterDeadLetter != Park && c.AfterDeadLetter != LetThrough:
		return nil, &idem.ArgumentError{Field: "consumer.Config.AfterDeadLetter", Reason: "must be Park or LetThrough"}
	case c.Retry.MaxAttempts < 0:
		return nil, &idem.ArgumentError{Field: "consumer.Config.Retry.MaxAttempts", Reason: "must not be negative"}
	case c.MaxDeliveries > 0 && c.MaxDeliveries < c.Retry.Attempts():
		return nil, &idem.ArgumentError{Field: "consumer.Config.MaxDeliveries",
			Reason: fmt.Sprintf("must not be below Retry.MaxAttempts (%d)", c.Retry.Attempts())}
	case c.Gap != idem.GapHold && c.Gap != idem.GapAllow:
		return nil, &idem.ArgumentError{Field: "consumer.Config.Gap", Reason: "must be idem.GapHold or idem.GapAllow"}
	}
	if c.Sequence != nil {
		if _, ok := c.Inbox.(idem.SequenceInbox); !ok {
			return nil, &idem.ArgumentError{Field: "consumer.Config.Inbox",
				Reason: fmt.Sprintf("must be an idem.SequenceInbox when Sequence is set, and a %T is not", c.Inbox)}
		}
	}
	if c.DedupKey == nil {
		c.DedupKey = func(m idem.Message) (string, error) { return m.ID, nil }
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = c.Retry.Attempts() + 5
	}
	if c.InTx == nil {
		c.InTx = func(ctx context.Context, fn func(context.Context) error) error { return fn(ctx) }
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Timers == nil {
		c.Timers = idem.RuntimeTimers{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Consumer{cfg: c, log: c.Logger.With(slog.String("consumer", c.Name)), subscribed: make(chan struct{})}, nil
}

// Stats returns the consumer's counts so far.
func (c *Consumer) Stats() Stats {
	return Stats{
		Processed:    c.processed.Load(),
		Duplicates:   c.duplicates.Load(),
		Retried:      c.retried.Load(),
		DeadLettered: c.deadLettered.Load(),
		Parked:       c.parked.Load(),
		Stale:        c.stale.Load(),
	}
}

// Run subscribes and handles deliveries with h until ctx is done, then
// returns nil once the handlers in flight have returned (their context is
// cancelled). Deliveries not settled by then are not acknowledged: the
// transport delivers them again, to this consumer's next run.
//
// When the subscription cannot be made or its stream fails (a broker
// restarting, a database that stopped answering), Run waits, spaced by
// Config.Resubscribe, and subscribes again: deliveries it held and did not
// settle come back from the transport. It returns early only when the
// transport is closed (idem.ErrClosed) or refuses the subscription as
// invalid (idem.ErrInvalidArgument), with that error, and with ErrRunning
// when the Consumer is already running.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return &idem.ArgumentError{Field: "consumer.Run handler", Reason: "must not be nil"}
	}
	return c.run(ctx, handlers{one: h})
}

// RunBatch is Run with a handler that applies a whole batch at once (see
// BatchHandler), for effects that can be written in bulk. Where the inbox
// cannot record a batch (it is not an idem.BatchInbox) or Config.BatchSize
// is 1, every call gets one message.
func (c *Consumer) RunBatch(ctx context.Context, h BatchHandler) error {
	if h == nil {
		return &idem.ArgumentError{Field: "consumer.RunBatch handler", Reason: "must not be nil"}
	}
	return c.run(ctx, handlers{
		one: func(ctx context.Context, m idem.Message) error {
			info, _ := InfoFromContext(ctx)
			return h(context.WithValue(ctx, batchInfoKey{}, []Info{info}), []idem.Message{m})
		},
		many: h,
	})
}

func (c *Consumer) run(ctx context.Context, h handlers) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)

	failures := 0
	var prev time.Duration
	for {
		began := c.cfg.Clock.Now()
		err := c.runOnce(ctx, h)
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case errors.Is(err, idem.ErrClosed), errors.Is(err, idem.ErrInvalidArgument):
			return err
		}
		if c.cfg.Clock.Now().Sub(began) > time.Minute {
			// It ran for a while: this failure starts a new series.
			failures, prev = 0, 0
		}
		failures++
		wait := c.cfg.Resubscribe.Delay(failures, prev)
		prev = wait
		c.log.LogAttrs(ctx, slog.LevelWarn, "the transport failed; subscribing again",
			slog.Int("failures", failures), slog.Duration("delay", wait), slog.String("error", err.Error()))
		woke := make(chan struct{})
		stop := c.cfg.Timers.AfterFunc(wait, func() { close(woke) })
		select {
		case <-woke:
		case <-ctx.Done():
			stop()
			return nil
		}
	}
}

// Subscribed returns a channel closed once Run has subscribed for the first
// time: from then on, the transport keeps what is published to the topic
// for the consumer's name, whether or not Run is still running. Where the
// subscription is what creates that state (a RabbitMQ queue, a JetStream
// durable consumer, a database transport's queue), start publishing
// after it, or the messages published before it never reach the consumer:
// a broker routes a message to the queues that exist when it arrives.
func (c *Consumer) Subscribed() <-chan struct{} { return c.subscribed }

// runOnce subscribes and handles deliveries until ctx is done (nil) or
// the subscription or its stream fails.
func (c *Consumer) runOnce(ctx context.Context, h handlers) error {
	stream, err := c.cfg.Subscriber.Subscribe(ctx, idem.Subscription{
		Topic:       c.cfg.Topic,
		Consumer:    c.cfg.Name,
		AckWait:     c.cfg.AckWait,
		MaxInFlight: c.cfg.MaxPending,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("consumer %q: subscribe to %q: %w", c.cfg.Name, c.cfg.Topic, err)
	}
	c.subscribedOnce.Do(func() { close(c.subscribed) })
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := newRunner(rctx, cancel, c, h, stream)
	err = r.run()
	if cerr := stream.Close(); cerr != nil && !errors.Is(cerr, idem.ErrClosed) {
		c.log.LogAttrs(ctx, slog.LevelWarn, "closing the stream failed", slog.String("error", cerr.Error()))
	}
	return err
}

// Info describes the delivery a Handler is processing.
type Info struct {
	// Consumer is the consumer's name.
	Consumer string
	// DedupKey is the key the inbox de-duplicates the message by, or,
	// with Config.Sequence set, the key its attempts are recorded under.
	DedupKey string
	// Aggregate and Seq are what Config.Sequence derived from the message:
	// the inbox de-duplicates by them. Empty and 0 when Sequence is nil.
	Aggregate string
	Seq       uint64
	// Attempt counts the attempts to process the message, from 1, across
	// redeliveries and consumer restarts: the transport's count
	// (idem.Delivery.Attempt) or the attempts the Ledger recorded plus
	// one, whichever is higher, less the redeliveries the consumer excused
	// (see Config.MaxDeliveries). Retry.MaxAttempts bounds it, but for
	// attempts whose failure could not be recorded (the delivery had gone
	// stale by the time the handler failed): MaxDeliveries bounds those. The transport's own
	// count, lapses included, stays on the delivery.
	Attempt int
}

type infoKey struct{}

// InfoFromContext returns the Info of the delivery being handled, when ctx
// is (derived from) a Handler's context.
func InfoFromContext(ctx context.Context) (Info, bool) {
	i, ok := ctx.Value(infoKey{}).(Info)
	return i, ok
}
