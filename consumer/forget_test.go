package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// forgetCounting is the ledger, telling for which dedup keys the consumer
// forgot recorded attempts.
type forgetCounting struct {
	idem.Ledger
	mu     sync.Mutex
	forgot []string
}

func (l *forgetCounting) ForgetAttempts(ctx context.Context, consumer, dedupKey string) error {
	l.mu.Lock()
	l.forgot = append(l.forgot, dedupKey)
	l.mu.Unlock()
	return l.Ledger.ForgetAttempts(ctx, consumer, dedupKey)
}

// A batch of first deliveries that never failed writes nothing to the
// ledger: forgetting recorded attempts is for a message that failed (or
// was delivered before), and would cost every batch a write per message in
// its transaction.
func TestBatchOfFirstDeliveriesForgetsNoAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ledger := &forgetCounting{Ledger: h.ledger}
	cfg := h.config()
	cfg.Ledger = ledger
	cfg.Concurrency = 1
	cfg.BatchSize = 10
	msgs := lanes(h, []string{"A", "B", "C"}, 4)
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error { return h.apply(ctx, m) })
	h.advanceUntil("every message processed", time.Second, func() bool { return c.Stats().Processed == int64(len(msgs)) })
	stop()
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	if len(ledger.forgot) != 0 {
		t.Errorf("attempts forgotten for %v; want none: every message was a first delivery and none failed", ledger.forgot)
	}
}
