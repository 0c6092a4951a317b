package consumer_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// txAcks is a subscriber whose streams tell, of every batch acknowledgement,
// whether it joined the inbox's transaction, and report the first batch as
// having one delivery handed out again before its acknowledgement (as a
// transport does when a delivery's acknowledgement deadline passed).
type txAcks struct {
	idem.Subscriber
	mu           sync.Mutex
	inTx, outTx  int // deliveries acknowledged inside and outside the transaction
	reportedOnce bool
}

func (s *txAcks) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	st, err := s.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &txAckStream{Stream: st, s: s}, nil
}

type txAckStream struct {
	idem.Stream
	s *txAcks
}

func (t *txAckStream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	return t.Stream.(idem.BatchStream).NextBatch(ctx, max)
}

func (t *txAckStream) AcksInTx(ctx context.Context) bool {
	return t.Stream.(idem.BatchStream).AcksInTx(ctx)
}

func (t *txAckStream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	n, err := t.Stream.(idem.BatchStream).AckBatch(ctx, ds)
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if _, ok := idemmem.TxFromContext(ctx); ok {
		t.s.inTx += len(ds)
	} else {
		t.s.outTx += len(ds)
	}
	if err == nil && !t.s.reportedOnce && n == len(ds) {
		t.s.reportedOnce = true
		n--
	}
	return n, err
}

// debugLog keeps the messages of the records logged at debug level, with
// their "stale" attribute (-1 when there is none).
type debugLog struct {
	mu    sync.Mutex
	stale map[string][]int64
}

func (l *debugLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *debugLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *debugLog) WithGroup(string) slog.Handler            { return l }
func (l *debugLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelDebug {
		return nil
	}
	v := int64(-1)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "stale" {
			v = a.Value.Int64()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stale[r.Message] = append(l.stale[r.Message], v)
	return nil
}

// Where the stream acknowledges inside the inbox's transaction (AcksInTx),
// a batch's acknowledgements commit with its effects, every one of them,
// and none is sent again after the commit; a batch whose acknowledgement
// finds deliveries handed out again meanwhile says how many at debug
// level, and a batch that finds none says nothing of it.
func TestBatchAcknowledgedInTheInboxTransaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	subs := &txAcks{Subscriber: h.rec}
	logs := &debugLog{stale: map[string][]int64{}}
	cfg := h.config()
	cfg.Subscriber = subs
	cfg.Concurrency = 1
	cfg.BatchSize = 10
	cfg.Logger = slog.New(logs)
	msgs := lanes(h, []string{"A", "B", "C"}, 4)
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error { return h.apply(ctx, m) })
	h.advanceUntil("every message processed", time.Second, func() bool { return c.Stats().Processed == int64(len(msgs)) })
	stop()
	subs.mu.Lock()
	inTx, outTx := subs.inTx, subs.outTx
	subs.mu.Unlock()
	if inTx != len(msgs) || outTx != 0 {
		t.Errorf("%d deliveries acknowledged in the inbox's transaction and %d after it; want all %d in it", inTx, outTx, len(msgs))
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	const stale = "deliveries of the batch were handed out again before their acknowledgement"
	if got := logs.stale[stale]; len(got) != 1 || got[0] != 1 {
		t.Errorf("debug records %q with stale = %v; want one, stale = 1 (the first batch's report only)", stale, got)
	}
}

// Where the stream cannot acknowledge inside the inbox's transaction, a
// batch's deliveries are acknowledged after its commit, in one call; an
// acknowledgement that finds deliveries handed out again meanwhile says
// how many at debug level (their new holder will find them applied), and
// one that finds none says nothing of it.
func TestBatchAcknowledgedAfterTheInboxTransaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.rec.acksAfterTx = true
	subs := &txAcks{Subscriber: h.rec}
	logs := &debugLog{stale: map[string][]int64{}}
	cfg := h.config()
	cfg.Subscriber = subs
	cfg.Concurrency = 1
	cfg.BatchSize = 10
	cfg.Logger = slog.New(logs)
	msgs := lanes(h, []string{"A", "B", "C"}, 4)
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error { return h.apply(ctx, m) })
	h.advanceUntil("every message processed", time.Second, func() bool { return c.Stats().Processed == int64(len(msgs)) })
	stop()
	subs.mu.Lock()
	inTx, outTx := subs.inTx, subs.outTx
	subs.mu.Unlock()
	if inTx != 0 || outTx != len(msgs) {
		t.Errorf("%d deliveries acknowledged in the inbox's transaction and %d after it; want all %d after it", inTx, outTx, len(msgs))
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	const stale = "deliveries were handed out again before their acknowledgement"
	if got := logs.stale[stale]; len(got) != 1 || got[0] != 1 {
		t.Errorf("debug records %q with stale = %v; want one, stale = 1 (the first batch's report only)", stale, got)
	}
	if got := logs.stale["deliveries of the batch were handed out again before their acknowledgement"]; len(got) != 0 {
		t.Errorf("reports of acknowledgements in the inbox's transaction: %v, want none", got)
	}
}
