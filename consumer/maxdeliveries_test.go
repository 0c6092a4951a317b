package consumer_test

import (
	"context"
	"errors"
	"strings"
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
