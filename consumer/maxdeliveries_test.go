package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// A message whose handling kills the consumer (here: a handler that never
// returns, and the consumer stopped under it, as a crash would) records
// no failure, and comes back after each AckWait. Past MaxDeliveries it is
// dead-lettered as exhausted, with the reason, without the handler running
// again, instead of coming back for good (or being dropped by a broker's
// own delivery limit).
func TestMaxDeliveriesEndsACrashLoop(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = time.Second
	maxDeliveries := cfg.Retry.MaxAttempts + 5 // the default
	var calls atomic.Int64
	entered := make(chan struct{}, 1)
	handler := func(ctx context.Context, m idem.Message) error {
		calls.Add(1)
		entered <- struct{}{}
		<-ctx.Done() // the process "dies" in the handler
		return ctx.Err()
	}
	h.publish(idem.Message{ID: "poison", Key: "k", Payload: []byte("{}")})
	for round := 1; ; round++ {
		if round > maxDeliveries+2 {
			t.Fatalf("still not dead-lettered after %d deliveries (handler ran %d times)", round-1, calls.Load())
		}
		_, stop := h.start(cfg, handler)
		got := false
		h.advanceUntil("the poison message delivered again, or dead-lettered", 100*time.Millisecond, func() bool {
			select {
			case <-entered:
				got = true
				return true
			default:
				return len(h.letters()) > 0
			}
		})
		stop()
		if !got {
			break
		}
	}
	if n := calls.Load(); n != int64(maxDeliveries) {
		t.Errorf("the handler ran %d times, want %d (MaxDeliveries), and not again after", n, maxDeliveries)
	}
	dls := h.letters()
	if len(dls) != 1 || dls[0].Class != idem.DeadExhausted || dls[0].Message.ID != "poison" {
		t.Fatalf("dead letters %+v, want the poison message, exhausted", dls)
	}
	if reason := dls[0].LastError(); !strings.Contains(reason, "no outcome recorded") {
		t.Errorf("its reason %q does not say it was delivered with no outcome", reason)
	}
}

func TestMaxDeliveriesBelowMaxAttemptsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.MaxDeliveries = cfg.Retry.MaxAttempts - 1
	if _, err := consumer.New(cfg); err == nil || !strings.Contains(err.Error(), "MaxDeliveries") {
		t.Fatalf("New with MaxDeliveries below MaxAttempts: %v", err)
	}
}

// The attempts the ledger recorded count even when the transport's own
// count starts again (a copy published again, a broker that lost its
// count): a message with Retry.MaxAttempts-1 failures recorded is
// dead-lettered, as exhausted, at its next failure, with every attempt.
func TestRecordedAttemptsCountTowardsMaxAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for n := 1; n <= 4; n++ {
		a := idem.Attempt{Number: n, At: h.clock.Now(), Class: idem.ClassTransient, Error: "timeout"}
		if _, err := h.ledger.RecordAttempt(context.Background(), "settlement", "evt-1", a); err != nil {
			t.Fatal(err)
		}
	}
	c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error { return errors.New("timeout") })
	h.publish(msg("evt-1", ""))
	waitFor(t, "the message dead-lettered", func() bool {
		s := c.Stats()
		return s.DeadLettered == 1 || s.Retried > 0
	})
	dls := h.letters()
	if s := c.Stats(); s.DeadLettered != 1 || s.Retried != 0 || len(dls) != 1 {
		t.Fatalf("stats %+v, %d dead letters; want the first failure in this run, the 5th attempt, dead-lettered", s, len(dls))
	}
	if dls[0].Class != idem.DeadExhausted || len(dls[0].Attempts) != 5 || dls[0].Attempts[4].Number != 5 {
		t.Errorf("dead letter %s with attempts %+v, want exhausted with attempts 1 to 5", dls[0].Class, dls[0].Attempts)
	}
}

// A keyed message queued behind a slow handler of its key, with the
// heartbeat late past the AckWait again and again (a loaded machine), is
// handed out again at each lapse, and each later delivery queues behind
// the earlier ones, which the late beats find stale. Those lapses are the
// consumer's own slowness, not a crash: once the message reaches the head
// of its key, its stale copies are let go for the live delivery, which is
// handled as the message's first attempt, and applied once, although the
// transport has delivered it more often than MaxDeliveries. It is not
// dead-lettered as a message that crashed its consumers.
func TestLapsesWhileQueuedDoNotCountTowardsMaxDeliveries(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	const ackWait, beat = time.Second, 250 * time.Millisecond
	cfg.AckWait, cfg.Concurrency = ackWait, 1
	cfg.Retry.MaxAttempts, cfg.MaxDeliveries = 3, 3
	lapses := cfg.MaxDeliveries + 1 // evt-2's live delivery is its (MaxDeliveries+2)th
	g := newGate()
	var a attemptsCounter
	asked, more := h.rec.holdNext(1)
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		a.add(ctx, m)
		if m.ID == "evt-1" {
			g.hold()
		}
		return h.apply(ctx, m)
	})
	// Registered after the consumer's stop, so run before it.
	release := sync.OnceFunc(g.release)
	t.Cleanup(release)
	t.Cleanup(func() { more() })
	waitFor(t, "the heartbeat waiting for its first beat", func() bool { return h.timers.Pending(beat) == 1 })
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	waitAsked(t, "evt-1 in memory", asked)
	asked, next := h.rec.holdNext(2)
	more()
	more = next
	h.publish(msg("evt-2", "acct-1"))
	waitAsked(t, "evt-2 in memory, queued behind evt-1", asked)

	for i := 1; i <= lapses; i++ {
		// Both deliveries' AckWait ends before the beat that would renew
		// them comes: the transport hands both messages out again.
		h.clock.Advance(ackWait)
		asked, next := h.rec.holdNext(2 + 2*i)
		more()
		more = next
		waitAsked(t, fmt.Sprintf("the deliveries %d of evt-1 and evt-2 in memory", i+1), asked)
		// The late beat finds the earlier ones stale.
		h.timers.Advance(0)
		waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	}
	release()

	total := int64(2 * (lapses + 1))
	waitFor(t, "every delivery settled or let go", func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.Stale+s.DeadLettered == total
	})
	for _, dl := range h.letters() {
		t.Errorf("%s dead-lettered (%s): %s", dl.Message.ID, dl.Class, dl.LastError())
	}
	for _, id := range []string{"evt-1", "evt-2"} {
		if n := h.applied.Get(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	if got := a.Seen("evt-2"); !slices.Equal(got, []int{1}) {
		t.Errorf("evt-2's handler ran with Info.Attempt %v, want [1]: its redeliveries while queued are no attempts", got)
	}
	if s := c.Stats(); s.Processed != 2 || s.DeadLettered != 0 || s.Parked != 0 {
		t.Errorf("Stats = %+v; want 2 processed (evt-1's first delivery, evt-2's live one), none dead-lettered", s)
	}
	if ops := h.rec.Ops("evt-2"); countOp(ops, "deliver") != lapses+1 || countOp(ops, "ack") != 1 || countOp(ops, "term") != 0 {
		t.Errorf("evt-2's deliveries: %v; want %d, the live one acknowledged, none terminated", ops, lapses+1)
	}
}

// The lapses that do count are those of a delivery the consumer attempted:
// a handler that outlasts the AckWait every time and then fails, its
// failure not recorded because its delivery is no longer the consumer's
// own (it is let go for the later delivery the transport handed out
// meanwhile), comes back as a crash would. Held in memory as it is when
// the later delivery arrives, it is not excused: past MaxDeliveries the
// message is dead-lettered as exhausted, without the handler running
// again, instead of looping for good.
func TestLapsesOfAttemptsCountTowardsMaxDeliveries(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	const ackWait = time.Second
	cfg.AckWait, cfg.Concurrency = ackWait, 1
	cfg.Retry.MaxAttempts, cfg.MaxDeliveries = 3, 3
	entered, proceed := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	asked, more := h.rec.holdNext(1)
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		calls.Add(1)
		select {
		case entered <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-proceed:
		case <-ctx.Done():
			return ctx.Err()
		}
		return idem.Permanent(errors.New("card declined"))
	})
	t.Cleanup(func() { more() })
	h.publish(msg("evt-1", "acct-1"))
	for i := 1; i <= cfg.MaxDeliveries; i++ {
		select {
		case <-entered:
		case <-time.After(waitLimit):
			t.Fatalf("evt-1's delivery %d not handled within %s", i, waitLimit)
		}
		waitAsked(t, fmt.Sprintf("evt-1's delivery %d in memory", i), asked)
		// The attempt outlasts its AckWait (no beat renews it): the
		// transport hands the message out again, behind it.
		h.clock.Advance(ackWait)
		var next func()
		asked, next = h.rec.holdNext(i + 1)
		more()
		more = next
		waitAsked(t, fmt.Sprintf("evt-1's delivery %d in memory", i+1), asked)
		proceed <- struct{}{}
	}
	waitFor(t, "evt-1 dead-lettered, or handled again", func() bool {
		return c.Stats().DeadLettered > 0 || calls.Load() > int64(cfg.MaxDeliveries)
	})
	if n := calls.Load(); n != int64(cfg.MaxDeliveries) {
		t.Errorf("the handler ran %d times, want %d (MaxDeliveries), and not again after", n, cfg.MaxDeliveries)
	}
	dls := h.letters()
	if len(dls) != 1 || dls[0].Class != idem.DeadExhausted || !strings.Contains(dls[0].LastError(), "no outcome recorded") {
		t.Fatalf("dead letters %+v, want evt-1, exhausted, delivered with no outcome recorded", dls)
	}
	if s := c.Stats(); s.Stale != int64(cfg.MaxDeliveries) {
		t.Errorf("Stats = %+v; want %d stale: each attempt's delivery let go for the next", s, cfg.MaxDeliveries)
	}
}

// A message of a key held back behind a dead letter, whose inbox
// transaction is slow while the heartbeat is late, is handed out again at
// each AckWait and its redeliveries queue behind it. None is attempted (the
// key is held, the handler never runs): each is let go from park for the
// next, and those lapses are the consumer's own slowness. The live delivery
// is parked, not dead-lettered "with no outcome recorded", unrun.
func TestLapsesOfParkedDeliveriesDoNotCount(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	cfg := h.config()
	const ackWait = time.Second
	cfg.AckWait, cfg.Concurrency = ackWait, 1
	cfg.Retry.MaxAttempts, cfg.MaxDeliveries = 3, 3
	g := newGate()
	cfg.Inbox = &holdingInbox{Inbox: h.inbox, id: "evt-2", g: g}
	if err := h.ledger.HoldBack(ctx, cfg.Name, "acct-1", "dl-1"); err != nil {
		t.Fatal(err)
	}
	asked, more := h.rec.holdNext(1)
	c, _ := h.start(cfg, h.apply)
	release := func() {}
	t.Cleanup(func() { release(); more() })
	h.publish(msg("evt-2", "acct-1"))
	g.wait(t, "evt-2's inbox transaction")
	release = g.release
	waitAsked(t, "evt-2 in memory", asked)
	lapses := cfg.MaxDeliveries + 1
	for i := 1; i <= lapses; i++ {
		// The AckWait ends; no beat renews it (the heartbeat is late).
		h.clock.Advance(ackWait)
		asked2, next := h.rec.holdNext(1 + i)
		more()
		more = next
		waitAsked(t, fmt.Sprintf("evt-2's delivery %d in memory", i+1), asked2)
	}
	g.release()
	release = func() {}
	waitFor(t, "evt-2 parked or dead-lettered", func() bool {
		s := c.Stats()
		return s.Parked+s.DeadLettered > 0
	})
	for _, dl := range h.letters() {
		t.Errorf("%s dead-lettered (%s), unrun: %s", dl.Message.ID, dl.Class, dl.LastError())
	}
	if s := c.Stats(); s.Parked != 1 || s.DeadLettered != 0 {
		t.Errorf("Stats = %+v; want evt-2 parked once, nothing dead-lettered", s)
	}
	t.Logf("ops %v", h.rec.Ops("evt-2"))
}

// The last attempt of a keyed message outlasts its AckWait and fails: its
// stale delivery is let go for the redelivery behind it, and the
// redelivery's attempt is numbered after the one that failed unrecorded,
// not the same number again.
func TestAttemptNumberGrowsPastAFailureLetGoStale(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	const ackWait, beat = 10 * time.Second, 2500 * time.Millisecond
	cfg.AckWait, cfg.Concurrency = ackWait, 1
	cfg.Retry.MaxAttempts, cfg.MaxDeliveries = 3, 10
	entered, proceed := make(chan struct{}), make(chan struct{})
	var a attemptsCounter
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		info, _ := consumer.InfoFromContext(ctx)
		a.add(ctx, m)
		if info.Attempt == 3 && len(a.Seen(m.ID)) == 3 {
			select {
			case entered <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			<-proceed
		}
		return errFlaky
	})
	waitFor(t, "the heartbeat waiting", func() bool { return h.timers.Pending(beat) == 1 })
	h.publish(msg("evt-1", "acct-1"))
	h.advanceUntil("attempt 3 running", time.Second, func() bool {
		select {
		case <-entered:
			return true
		default:
			return false
		}
	})
	asked, more := h.rec.holdNext(2)
	t.Cleanup(more)
	h.clock.Advance(ackWait)
	waitAsked(t, "the redelivery in memory behind attempt 3", asked)
	close(proceed)
	more()
	h.advanceUntil("dead-lettered", time.Second, func() bool { return c.Stats().DeadLettered == 1 })
	seen := a.Seen("evt-1")
	t.Logf("attempts %v", seen)
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Errorf("Info.Attempt repeats or goes back: %v", seen)
			break
		}
	}
}

// A copy published again under a message's ID is another transport
// message, which the transport counts on its own: a stale delivery of one
// superseded by a delivery of the other with the same count is no
// redelivery, and its lapse is not excused. Here x is published twice (x1
// and x2, of key acct-1), and a first consumer takes both, behind h, and is
// stopped: both come back at attempt 2, their first deliveries out of
// memory. The second consumer holds them behind h, whose handler holds,
// while the heartbeat comes late past the AckWait: all are delivered again
// (attempt 3) behind them and the second deliveries are found stale. Once
// h is done, x1's attempt-2 delivery is let go for x2's, with the same
// count, not excused; x2's is let go for x1's attempt 3, excused by one. x
// is handled once, as attempt 2: x1's three deliveries less the one lapse
// excused. The first consumer's delivery, lost with it, still counts, as a
// crash does; excusing the copy's lapse as well would number it 1. (h is
// published twice too, so that x1 does not join h's batch before it is
// found stale: h's copy does not fit in it.)
func TestLapseOfACopyPublishedAgainIsNotExcused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const ackWait, beat = time.Second, 250 * time.Millisecond
	h.publish(msg("h", "acct-1"), msg("h", "acct-1"), msg("x", "acct-1"), msg("x", "acct-1"))

	first := h.config()
	first.AckWait, first.Concurrency = ackWait, 1
	first.Timers = newFakeTimers(h.clock)
	entered := make(chan struct{})
	enter := sync.OnceFunc(func() { close(entered) })
	asked, more := h.rec.holdNext(4)
	t.Cleanup(func() { more() })
	_, stop := h.start(first, func(ctx context.Context, m idem.Message) error {
		enter()
		<-ctx.Done() // the process "dies" in h's handler
		return ctx.Err()
	})
	waitClosed(t, "h's handler in the first consumer", entered)
	waitAsked(t, "h, x and their copies in the first consumer's memory", asked)
	stop()
	more()

	cfg := h.config()
	cfg.AckWait, cfg.Concurrency = ackWait, 1
	cfg.Retry.MaxAttempts, cfg.MaxDeliveries = 5, 10
	g := newGate()
	var a attemptsCounter
	asked, more = h.rec.holdNext(8)
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		a.add(ctx, m)
		if m.ID == "h" {
			g.hold()
		}
		return h.apply(ctx, m)
	})
	// Registered after the consumer's stop, so run before it.
	release := sync.OnceFunc(g.release)
	t.Cleanup(release)
	waitFor(t, "the heartbeat waiting for its first beat", func() bool { return h.timers.Pending(beat) == 1 })
	g.wait(t, "h's handler")
	waitAsked(t, "the second deliveries in memory", asked)
	// Their AckWait ends before the beat that would renew them comes: the
	// transport hands the four messages out again, behind them.
	h.clock.Advance(ackWait)
	asked, next := h.rec.holdNext(12)
	more()
	more = next
	waitAsked(t, "the third deliveries in memory", asked)
	// The late beat finds the second deliveries stale.
	h.timers.Advance(0)
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	release()

	waitFor(t, "every delivery settled or let go", func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.Stale+s.DeadLettered == 8
	})
	if got := a.Seen("x"); !slices.Equal(got, []int{2}) {
		t.Errorf("x's handler ran with Info.Attempt %v, want [2]: x1's three deliveries less its one lapse excused (x2's delivery with the same count is a copy's, not a redelivery)", got)
	}
	for _, id := range []string{"h", "x"} {
		if n := h.applied.Get(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	if s := c.Stats(); s.Processed != 2 || s.Stale != 3 || s.DeadLettered != 0 {
		t.Errorf("Stats = %+v; want 2 processed, 3 stale (h's copy's, x1's and x2's second deliveries), none dead-lettered", s)
	}
}
