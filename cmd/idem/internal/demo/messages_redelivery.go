package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// The redelivery scenario's plan: of its events, every lostAckEvery-th
// has its first acknowledgement lost, and the consumer is killed once,
// between the commit and the acknowledgement of event killAt.
const (
	redeliveryEvents = 20
	lostAckEvery     = 4
	killAt           = 10
	eventAmount      = 12_000
)

// RedeliveryRow is one run of the redelivery scenario: the same events
// delivered at least once, applied by a consumer that adds each amount to
// a total.
type RedeliveryRow struct {
	Mode Mode
	// Consumer says how the consumer de-duplicates.
	Consumer string
	// Events is how many events were published; Deliveries how many
	// deliveries the transport made of them.
	Events, Deliveries int
	// Applied is how many times the handler's addition committed.
	Applied int
	// Total is the total the consumer's table holds; ShouldBe what it
	// would hold had each event been added once.
	Total, ShouldBe int64
	Currency        string
}

// ExactlyOnce reports whether each event was added once.
func (r RedeliveryRow) ExactlyOnce() bool {
	return r.Events > 0 && r.Applied == r.Events && r.Total == r.ShouldBe
}

// Verdict is "exactly once", "COUNTED TWICE (+N CUR)" or "LOST (-N CUR)".
func (r RedeliveryRow) Verdict() string {
	switch {
	case r.ExactlyOnce():
		return "exactly once"
	case r.Total > r.ShouldBe:
		return fmt.Sprintf("COUNTED TWICE (+%s)", money(r.Total-r.ShouldBe, r.Currency))
	case r.Total < r.ShouldBe:
		return fmt.Sprintf("LOST (-%s)", money(r.ShouldBe-r.Total, r.Currency))
	}
	return "inconsistent (applied and total disagree)"
}

// errKilled is what the killed consumer's inbox returns after its commit:
// the consumer stops there, as if its process had died, and acknowledges
// nothing.
var errKilled = errors.New("demo: the consumer was killed between its commit and its acknowledgement")

// killingInbox kills the consumer once, right after the commit of one
// message and before the consumer hears of it: the moment a crash leaves a
// message applied and not acknowledged (payments' crash-after-settle fault,
// in process).
type killingInbox struct {
	idem.Inbox
	target string
	once   atomic.Bool
	mu     sync.Mutex
	kill   context.CancelFunc
}

func (k *killingInbox) Process(ctx context.Context, name, dedupKey string, fn func(ctx context.Context) error) error {
	err := k.Inbox.Process(ctx, name, dedupKey, fn)
	if err == nil && dedupKey == k.target && k.once.CompareAndSwap(false, true) {
		k.mu.Lock()
		k.kill()
		k.mu.Unlock()
		return errKilled
	}
	return err
}

func (k *killingInbox) setKill(kill context.CancelFunc) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kill = kill
}

// playRedelivery publishes the scenario's events and has them applied, with
// the faults, by a consumer whose inbox is inbox (consumer.NoInbox for the
// unsafe run).
func playRedelivery(ctx context.Context, l *msgLab, mode Mode, design string, inbox idem.Inbox) (RedeliveryRow, error) {
	run := "redelivery/" + string(mode)
	clock := newLabClock(l.start)
	tr, err := l.transport(ctx, clock, wakePoll)
	if err != nil {
		return RedeliveryRow{}, err
	}
	defer tr.Close()
	topic := "demo.redelivery." + string(mode)
	id := func(i int) string { return fmt.Sprintf("evt_redelivery_%s_%02d", mode, i) }
	lost := make(map[string]bool)
	msgs := make([]idem.Message, redeliveryEvents)
	for i := range msgs {
		if i%lostAckEvery == lostAckEvery-1 {
			lost[id(i)] = true
		}
		msgs[i] = idem.Message{
			ID: id(i), Topic: topic, Key: fmt.Sprintf("acct-%d", i%4+1), Time: clock.Now(),
			Headers: map[string]string{"Content-Type": "application/json"},
			Payload: fmt.Appendf(nil, `{"event_id":%q,"amount":%d,"currency":%q}`, id(i), eventAmount, currency),
		}
	}
	if err := l.exec(ctx, `INSERT INTO demo_totals (run, total, applied) VALUES (?, 0, 0)`, run); err != nil {
		return RedeliveryRow{}, err
	}
	if err := tr.Publish(ctx, msgs...); err != nil {
		return RedeliveryRow{}, err
	}

	w := &wire{Subscriber: tr, loseAck: func(d idem.Delivery) bool { return d.Attempt() == 1 && lost[d.Message().ID] }}
	ki := &killingInbox{Inbox: inbox, target: id(killAt)}
	cfg := &consumer.Config{
		Name: "redelivery-" + string(mode), Topic: topic,
		Subscriber: w, Inbox: ki, DeadLetters: l.letters, Ledger: l.ledger, InTx: l.inTx,
		// One message at a time, held alone: when the consumer is killed,
		// only the message it was applying is unacknowledged, so the
		// deliveries are the same on every run.
		Concurrency: 1, MaxPending: 1, BatchSize: 1,
		AckWait: labAckWait, Clock: clock, Timers: clock, Logger: l.logger,
	}
	handler := func(ctx context.Context, m idem.Message) error {
		var ev struct{ Amount int64 }
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			return idem.Permanent(err)
		}
		// The effect adds: not idempotent. Under the inbox this joins its
		// transaction; under NoInbox it commits on its own.
		return l.exec(ctx, `UPDATE demo_totals SET total = total + ?, applied = applied + 1 WHERE run = ?`, ev.Amount, run)
	}

	// The first incarnation runs until it is killed.
	c, err := consumer.New(cfg)
	if err != nil {
		return RedeliveryRow{}, err
	}
	first, kill := context.WithCancel(ctx)
	ki.setKill(kill)
	err = c.Run(first, handler)
	kill()
	switch {
	case err != nil:
		return RedeliveryRow{}, err
	case ctx.Err() != nil:
		return RedeliveryRow{}, ctx.Err()
	case !ki.once.Load():
		return RedeliveryRow{}, errors.New("the consumer stopped before it was killed")
	}
	c, err = consumer.New(cfg)
	if err != nil {
		return RedeliveryRow{}, err
	}
	stop := runConsumer(ctx, func(ctx context.Context) error { return c.Run(ctx, handler) })
	defer func() { _ = stop() }()
	// Closing the killed incarnation's stream gave back what it held
	// unsettled: the killed message, and those whose acknowledgement was
	// lost, which the transport had not heard of either. The next
	// incarnation gets them again at once, then the rest of the events;
	// the acknowledgements it loses come back once their ack wait ends.
	// Every delivery is settled in the end but the killed one.
	lostBefore := 0
	for i := range killAt {
		if lost[id(i)] {
			lostBefore++
		}
	}
	firstRound := int64(redeliveryEvents + lostBefore)
	if err := waitUntil(ctx, "every event delivered", func() bool { return w.settled() == firstRound }); err != nil {
		return RedeliveryRow{}, err
	}
	clock.Advance(labAckWait)
	if err := waitUntil(ctx, "the redeliveries after the lost acknowledgements", func() bool {
		return w.settled() == redeliveryEvents+int64(len(lost))
	}); err != nil {
		return RedeliveryRow{}, err
	}
	if err := stop(); err != nil {
		return RedeliveryRow{}, err
	}

	row := RedeliveryRow{Mode: mode, Consumer: design, Events: redeliveryEvents, Deliveries: int(w.deliveries.Load()),
		ShouldBe: redeliveryEvents * eventAmount, Currency: currency}
	if err := l.db.Reader().QueryRowContext(ctx, `SELECT total, applied FROM demo_totals WHERE run = ?`, run).
		Scan(&row.Total, &row.Applied); err != nil {
		return RedeliveryRow{}, fmt.Errorf("reading the total back: %w", err)
	}
	return row, nil
}
