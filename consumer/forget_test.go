package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// ledgerCalls is the ledger, noting the dedup keys whose recorded attempts
// the consumer read (Attempts) and forgot (ForgetAttempts).
type ledgerCalls struct {
	idem.Ledger
	mu     sync.Mutex
	read   []string
	forgot []string
}

func (l *ledgerCalls) Attempts(ctx context.Context, consumer, dedupKey string) ([]idem.Attempt, error) {
	l.mu.Lock()
	l.read = append(l.read, dedupKey)
	l.mu.Unlock()
	return l.Ledger.Attempts(ctx, consumer, dedupKey)
}

func (l *ledgerCalls) ForgetAttempts(ctx context.Context, consumer, dedupKey string) error {
	l.mu.Lock()
	l.forgot = append(l.forgot, dedupKey)
	l.mu.Unlock()
	return l.Ledger.ForgetAttempts(ctx, consumer, dedupKey)
}

// calls returns the keys read and forgotten so far.
func (l *ledgerCalls) calls() (read, forgot []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.read), slices.Clone(l.forgot)
}

// firstDeliveries runs a consumer (one at a time, in batches of batch)
// over lanes A, B and C of perLane messages each, which its handler
// applies at their first delivery, and returns the ledger's calls.
func firstDeliveries(t *testing.T, batch, perLane int) *ledgerCalls {
	t.Helper()
	h := newHarness(t)
	ledger := &ledgerCalls{Ledger: h.ledger}
	cfg := h.config()
	cfg.Ledger = ledger
	cfg.Concurrency = 1
	cfg.BatchSize = batch
	msgs := lanes(h, []string{"A", "B", "C"}, perLane)
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error { return h.apply(ctx, m) })
	h.advanceUntil("every message processed", time.Second, func() bool { return c.Stats().Processed == int64(len(msgs)) })
	stop()
	return ledger
}

// A batch of first deliveries that never failed writes nothing to the
// ledger: forgetting recorded attempts is for a message that failed (or
// was delivered before), and would cost every batch a write per message in
// its transaction.
func TestBatchOfFirstDeliveriesForgetsNoAttempts(t *testing.T) {
	t.Parallel()
	if _, forgot := firstDeliveries(t, 10, 4).calls(); len(forgot) != 0 {
		t.Errorf("attempts forgotten for %v; want none: every message was a first delivery and none failed", forgot)
	}
}

// One message at a time too (BatchSize 1), a first delivery that never
// failed writes nothing to the ledger in its inbox transaction; one that
// failed has its recorded attempts forgotten when it is applied.
func TestFirstDeliveryForgetsNoAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ledger := &ledgerCalls{Ledger: h.ledger}
	cfg := h.config()
	cfg.Ledger = ledger
	cfg.Concurrency = 1
	cfg.BatchSize = 1
	var calls attemptsCounter
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 && m.ID == "flaky" {
			return errFlaky
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("first-1", "A"), msg("first-2", "B"), msg("flaky", "C"))
	h.advanceUntil("every message processed", time.Second, func() bool { return c.Stats().Processed == 3 })
	stop()
	if _, forgot := ledger.calls(); !slices.Equal(forgot, []string{"flaky"}) {
		t.Errorf("attempts forgotten for %v; want only flaky's, the one message that failed", forgot)
	}
	if a, _ := h.ledger.Attempts(context.Background(), cfg.Name, "flaky"); len(a) != 0 {
		t.Errorf("flaky's attempts after it was applied: %+v, want none", a)
	}
}

// A message that failed and waits for its retry inside the consumer, and
// whose copy another replica of the consumer applied meanwhile, is a
// duplicate when its retry comes: it is acknowledged, and its recorded
// attempts, of no more use, are forgotten, one message at a time and in
// batches alike.
func TestRetriedMessageAppliedMeanwhileForgetsItsAttempts(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := context.Background()
			cfg := h.config()
			cfg.Concurrency, cfg.BatchSize = 1, batch
			var calls attemptsCounter
			c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
				calls.add(ctx, m)
				return errFlaky
			})
			h.publish(msg("evt-1", "K"))
			waitFor(t, "evt-1's first attempt failed", func() bool { return c.Stats().Retried == 1 })
			if a, err := h.ledger.Attempts(ctx, cfg.Name, "evt-1"); err != nil || len(a) != 1 {
				t.Fatalf("evt-1's recorded attempts: %+v, %v; want its failed one", a, err)
			}
			// Another replica applies a copy of evt-1.
			if err := h.inbox.Process(ctx, cfg.Name, "evt-1", func(ctx context.Context) error { return h.applied.Add(ctx, "evt-1", 1) }); err != nil {
				t.Fatal(err)
			}
			h.advanceUntil("evt-1's retry found a duplicate", time.Second, func() bool { return c.Stats().Duplicates == 1 })
			if a, err := h.ledger.Attempts(ctx, cfg.Name, "evt-1"); err != nil || len(a) != 0 {
				t.Errorf("evt-1's recorded attempts after its duplicate: %+v, %v; want none", a, err)
			}
			if n := calls.Calls("evt-1"); n != 1 {
				t.Errorf("the handler ran %d times for evt-1, want once (the retry is a duplicate)", n)
			}
			if ops := h.rec.Ops("evt-1"); countOp(ops, "ack") != 1 {
				t.Errorf("evt-1's deliveries: %v; want the duplicate acknowledged", ops)
			}
			if s := c.Stats(); s.DeadLettered != 0 || s.Processed != 0 {
				t.Errorf("Stats = %+v, want 1 retried and 1 duplicate only", s)
			}
		})
	}
}

// A first delivery costs no read of the ledger before its attempt: only a
// delivery the transport hands out again (Attempt above 1) may have
// attempts recorded by an earlier run. In batches and one at a time.
func TestFirstDeliveriesReadNoAttempts(t *testing.T) {
	t.Parallel()
	if read, _ := firstDeliveries(t, 0, 3).calls(); len(read) != 0 {
		t.Errorf("recorded attempts read for %v; want none: every message was a first delivery and none failed", read)
	}
}
