package demo

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// The poison scenario's plan.
const (
	// healthyEvents follow the poison message in the queue.
	healthyEvents = 20
	// naiveRetryEvery is how often the naive consumer retries its head.
	naiveRetryEvery = time.Second
	// poisonWatch is how long the lab watches the naive consumer retry.
	poisonWatch = 2 * time.Minute
	// poisonAttempts is idem's consumer's bound: RetryPolicy's default.
	poisonAttempts = 10
)

// errPoison is the poison message's failure, every time. Nobody marked it
// permanent (few errors are, in practice), so only a bound on the retries
// takes it out of the flow.
var errPoison = errors.New(`fx rates: no rate for currency "XTS"`)

// PoisonRow is one run of the poison scenario: one event that always
// fails, at the head of the queue, and healthy events behind it.
type PoisonRow struct {
	Mode Mode
	// Consumer says how the consumer retries.
	Consumer string
	// Healthy is how many healthy events follow the poison; Applied how
	// many of them were applied.
	Healthy, Applied int
	// LongestWait is the longest any healthy event waited, on the lab's
	// clock, from its publication to its commit or, for one never
	// applied, to the end of the watch.
	LongestWait time.Duration
	// PoisonAttempts counts the attempts at the poison message.
	PoisonAttempts int
	// DeadLetter is the poison's dead letter, "" when it has none.
	DeadLetter string
	// Watched is how long the lab's clock ran.
	Watched time.Duration
}

// Blocked reports whether healthy events are stuck behind the poison.
func (r PoisonRow) Blocked() bool { return r.Applied < r.Healthy }

// Verdict is "BLOCKED: …" or "flows; …".
func (r PoisonRow) Verdict() string {
	switch {
	case r.Blocked():
		return fmt.Sprintf("BLOCKED: %d healthy events stuck behind it", r.Healthy-r.Applied)
	case r.DeadLetter != "":
		return fmt.Sprintf("flows; poison dead-lettered after %d attempts", r.PoisonAttempts)
	}
	return "flows; the poison is still retried"
}

// poisonEvents are the scenario's messages: the poison first, then the
// healthy events, each of an account of its own.
func poisonEvents(mode Mode, topic string, now time.Time) (msgs []idem.Message, poisonID string) {
	poisonID = fmt.Sprintf("evt_poison_%s", mode)
	msgs = append(msgs, idem.Message{
		ID: poisonID, Topic: topic, Key: "acct-poison", Time: now,
		Headers: map[string]string{"Content-Type": "application/json"},
		Payload: fmt.Appendf(nil, `{"event_id":%q,"amount":%d,"currency":"XTS"}`, poisonID, eventAmount),
	})
	for i := range healthyEvents {
		id := fmt.Sprintf("evt_healthy_%s_%02d", mode, i)
		msgs = append(msgs, idem.Message{
			ID: id, Topic: topic, Key: fmt.Sprintf("acct-%d", i+1), Time: now,
			Headers: map[string]string{"Content-Type": "application/json"},
			Payload: fmt.Appendf(nil, `{"event_id":%q,"amount":%d,"currency":%q}`, id, eventAmount, currency),
		})
	}
	return msgs, poisonID
}

// poisonHandler fails the poison every time and records, for a healthy
// event, when it was applied on the lab's clock, in the inbox's
// transaction.
func poisonHandler(l *msgLab, run, poisonID string, clock *labClock, attempts *atomic.Int64) consumer.Handler {
	return func(ctx context.Context, m idem.Message) error {
		if m.ID == poisonID {
			attempts.Add(1)
			return errPoison
		}
		return l.exec(ctx, `INSERT INTO demo_applied (run, event, published, applied_at) VALUES (?, ?, ?, ?)`,
			run, m.ID, labTime(m.Time), labTime(clock.Now()))
	}
}

// headOfLine is the consumer the chapter warns about: it takes its queue's
// messages one at a time, in order, and retries the one at the head, every
// naiveRetryEvery, until it succeeds, so that nothing behind it moves
// meanwhile. It uses the same transport and inbox as idem's consumer; only
// its retries differ.
func headOfLine(ctx context.Context, sub idem.Subscriber, inbox idem.Inbox, clock *labClock, name, topic string, h consumer.Handler) error {
	stream, err := sub.Subscribe(ctx, idem.Subscription{Topic: topic, Consumer: name, AckWait: labAckWait, MaxInFlight: 1})
	if err != nil {
		return err
	}
	defer stream.Close()
	for {
		d, err := stream.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		m := d.Message()
		for {
			err := inbox.Process(ctx, name, m.ID, func(ctx context.Context) error { return h(ctx, m) })
			if err == nil || errors.Is(err, idem.ErrDuplicate) {
				break
			}
			if clock.sleep(ctx, naiveRetryEvery) != nil {
				return nil
			}
		}
		if err := d.Ack(ctx); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// playPoison runs the poison scenario: unsafe with headOfLine, protected
// with idem's consumer and its default retry policy.
func playPoison(ctx context.Context, l *msgLab, mode Mode, design string) (PoisonRow, error) {
	run := "poison/" + string(mode)
	clock := newLabClock(l.start)
	tr, err := l.transport(ctx, clock, idlePoll)
	if err != nil {
		return PoisonRow{}, err
	}
	defer tr.Close()
	topic := "demo.poison." + string(mode)
	name := "poison-" + string(mode)
	msgs, poisonID := poisonEvents(mode, topic, clock.Now())
	var attempts atomic.Int64
	h := poisonHandler(l, run, poisonID, clock, &attempts)
	w := &wire{Subscriber: tr}
	letters, err := l.lettersOn(ctx, clock)
	if err != nil {
		return PoisonRow{}, err
	}
	// The transport keeps a topic's messages for a consumer name from the
	// start of its log, so they may be published before the consumer
	// subscribes.
	if err := tr.Publish(ctx, msgs...); err != nil {
		return PoisonRow{}, err
	}

	var c *consumer.Consumer
	var stop func() error
	until := l.start.Add(poisonWatch)
	if mode == ModeUnsafe {
		stop = runConsumer(ctx, func(ctx context.Context) error { return headOfLine(ctx, w, l.inbox, clock, name, topic, h) })
	} else {
		c, err = consumer.New(&consumer.Config{
			Name: name, Topic: topic,
			Subscriber: w, Inbox: l.inbox, DeadLetters: letters, Ledger: l.ledger, InTx: l.inTx,
			// One worker, as the naive consumer has: what frees the queue
			// is where the retry waits, not more workers.
			Concurrency: 1,
			Retry:       idem.RetryPolicy{MaxAttempts: poisonAttempts, Rand: newLabRand(labSeed)},
			AckWait:     labAckWait, Clock: clock, Timers: clock, Logger: l.logger,
		})
		if err != nil {
			return PoisonRow{}, err
		}
		stop = runConsumer(ctx, func(ctx context.Context) error { return c.Run(ctx, h) })
		// Past the policy's every delay: the clock stops at the dead letter.
		until = l.start.Add(24 * time.Hour)
	}
	defer func() { _ = stop() }()

	var quiet, done func() bool
	if mode == ModeUnsafe {
		// The naive consumer waits for its retry, and nothing else moves.
		quiet = func() bool { return clock.waiting() == 1 }
		done = func() bool { return false }
	} else {
		quiet = func() bool {
			s := c.Stats()
			return s.Processed == healthyEvents && (clock.waiting() == 1 || s.DeadLettered == 1)
		}
		done = func() bool { return c.Stats().DeadLettered == 1 }
	}
	if err := clock.run(ctx, "the poison's retries", quiet, done, l.start, 0, until); err != nil {
		return PoisonRow{}, err
	}
	if mode == ModeUnsafe {
		clock.Set(until)
	}
	if err := stop(); err != nil {
		return PoisonRow{}, err
	}

	row := PoisonRow{Mode: mode, Consumer: design, Healthy: healthyEvents, PoisonAttempts: int(attempts.Load()),
		Watched: clock.Now().Sub(l.start)}
	var longest int64
	if err := l.db.Reader().QueryRowContext(ctx, `SELECT count(*), coalesce(max(applied_at - published), 0) FROM demo_applied WHERE run = ?`, run).
		Scan(&row.Applied, &longest); err != nil {
		return PoisonRow{}, fmt.Errorf("reading the healthy events back: %w", err)
	}
	row.LongestWait = time.Duration(longest)
	if row.Applied < row.Healthy {
		// Those never applied have waited the whole watch, and still do.
		row.LongestWait = clock.Now().Sub(l.start)
	}
	if mode == ModeProtected {
		dls, err := letters.List(ctx, idem.DeadLetterFilter{Consumer: name})
		if err != nil {
			return PoisonRow{}, fmt.Errorf("reading the dead letters: %w", err)
		}
		for _, dl := range dls {
			if dl.Message.ID == poisonID {
				row.DeadLetter = dl.ID
			}
		}
	}
	return row, nil
}
