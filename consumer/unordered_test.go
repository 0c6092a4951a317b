package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// A failed attempt counts as retried (Stats.Retried) once its retry is
// scheduled, not before: under Unordered, once the transport has its Nack
// with the delay. Whoever reads Retried and then moves the clock (as
// ExampleConfig_unordered does) must find the retry due from the time it
// read, not from a Nack sent after it moved.
func TestRetriedCountedOnceTheRetryIsScheduled(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.rec.nackGate = make(chan struct{})
	cfg := h.config()
	cfg.Unordered = true
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		return idem.RetryAfter(errFlaky, time.Hour)
	})
	h.publish(msg("a1", "A"))
	waitFor(t, "a1's Nack sent", func() bool {
		return slices.Contains(h.rec.Ops("a1"), "nack "+time.Hour.String())
	})
	if n := c.Stats().Retried; n != 0 {
		t.Errorf("Retried = %d while the Nack that schedules the retry has not returned, want 0", n)
	}
	close(h.rec.nackGate)
	waitFor(t, "the retry counted once scheduled", func() bool { return c.Stats().Retried == 1 })
}

// Under Unordered, a keyed message that failed is handed back to the
// transport, and the later message of its key overtakes it; by default it
// waits at the head of its key (TestWaitingKeyDoesNotBlockOthers).
func TestUnorderedLetsALaterMessageOvertakeARetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Unordered = true
	cfg.Concurrency = 1
	var mu sync.Mutex
	var order []string
	var calls attemptsCounter
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 && m.ID == "a1" {
			return idem.RetryAfter(errFlaky, time.Hour)
		}
		mu.Lock()
		order = append(order, m.ID)
		mu.Unlock()
		return h.apply(ctx, m)
	})
	h.publish(msg("a1", "A"), msg("a2", "A"))

	waitFor(t, "a2 processed while a1 waits", func() bool { return c.Stats().Processed == 1 })
	waitFor(t, "a1 handed back to the transport", func() bool {
		return slices.Contains(h.rec.Ops("a1"), "nack "+time.Hour.String())
	})
	if n := h.timers.Pending(time.Hour); n != 0 {
		t.Errorf("%d retry timers of an hour pending in the consumer, want 0: the retry is the transport's", n)
	}
	h.timers.Advance(time.Hour)
	waitFor(t, "a1 processed on its retry", func() bool { return c.Stats().Processed == 2 })
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a2", "a1"}; !slices.Equal(order, want) {
		t.Errorf("applied %v, want %v", order, want)
	}
}

// Under Unordered, a key's messages are handled at once.
func TestUnorderedHandlesAKeysMessagesAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Unordered = true
	cfg.Concurrency = 2
	cfg.BatchSize = 1
	both := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(2)
	go func() { arrived.Wait(); close(both) }()
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		arrived.Done()
		// Each waits for the other: under per-key order this never ends.
		select {
		case <-both:
		case <-ctx.Done():
			return ctx.Err()
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("k1", "K"), msg("k2", "K"))
	waitFor(t, "both messages of key K handled at once", func() bool { return c.Stats().Processed == 2 })
}

// Under Unordered, a dead letter holds no key back: the later messages of
// its key are applied.
func TestUnorderedDeadLetterHoldsNoKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Unordered = true
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "k1" {
			return idem.Permanent(errors.New("malformed"))
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("k1", "K"), msg("k2", "K"), msg("k3", "K"))
	waitFor(t, "k1 dead-lettered, k2 and k3 processed", func() bool {
		s := c.Stats()
		return s.DeadLettered == 1 && s.Processed == 2
	})
	if s := c.Stats(); s.Parked != 0 {
		t.Errorf("%d parked, want 0", s.Parked)
	}
	if _, held, _ := h.ledger.HeldBack(context.Background(), "settlement", "K"); held {
		t.Errorf("key K held back under Unordered")
	}
}

// NoInbox de-duplicates nothing: a message delivered twice runs the
// handler twice.
func TestNoInboxRunsEveryDelivery(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Inbox = consumer.NoInbox{}
	var calls attemptsCounter
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		calls.add(ctx, m)
		return nil
	})
	h.publish(msg("m1", "K"), msg("m1", "K"), msg("m2", ""))
	waitFor(t, "three deliveries processed", func() bool { return c.Stats().Processed == 3 })
	if got := calls.Calls("m1"); got != 2 {
		t.Errorf("m1 delivered twice ran the handler %d times, want 2", got)
	}
	if s := c.Stats(); s.Duplicates != 0 {
		t.Errorf("%d duplicates, want 0", s.Duplicates)
	}
}

func TestNoInboxProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ran := 0
	fn := func(context.Context) error { ran++; return nil }
	for _, tc := range []struct {
		name               string
		consumer, dedupKey string
		fn                 func(context.Context) error
		field              string
	}{
		{"no consumer", "", "m1", fn, "consumer"},
		{"no dedup key", "c", "", fn, "dedupKey"},
		{"no fn", "c", "m1", nil, "fn"},
	} {
		err := consumer.NoInbox{}.Process(ctx, tc.consumer, tc.dedupKey, tc.fn)
		var ae *idem.ArgumentError
		if !errors.As(err, &ae) || ae.Field != tc.field {
			t.Errorf("%s: err = %v, want an *idem.ArgumentError on %s", tc.name, err, tc.field)
		}
	}
	if ran != 0 {
		t.Fatalf("fn ran %d times on refused calls", ran)
	}
	failed := errors.New("effect failed")
	for range 2 {
		if err := (consumer.NoInbox{}).Process(ctx, "c", "m1", fn); err != nil {
			t.Fatalf("Process: %v", err)
		}
	}
	if ran != 2 {
		t.Errorf("fn ran %d times for two calls with one key, want 2", ran)
	}
	if err := (consumer.NoInbox{}).Process(ctx, "c", "m1", func(context.Context) error { return failed }); err != failed {
		t.Errorf("Process returned %v, want fn's error unchanged", err)
	}
}
