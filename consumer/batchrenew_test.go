package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// renewals makes the recorder's streams renew in batches
// (idem.BatchRenewer) and writes down each InProgressBatch call: the
// message IDs of its deliveries, in order. The calls reach the in-memory
// transport's own InProgressBatch, except as fail, refuse and extra say.
type renewals struct {
	mu    sync.Mutex
	calls [][]string
	// fail, when set, answers the next call, which does not reach the
	// transport, and is then cleared.
	fail error
	// refuse names the messages whose deliveries are answered stale,
	// without reaching the transport.
	refuse map[string]bool
	// extra is added to every answer: indexes that name no delivery of
	// the call, as a transport gone wrong might return.
	extra []int
}

// Calls returns the calls made so far.
func (b *renewals) Calls() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

type renewStream struct {
	recStream
	b *renewals
}

func (s *renewStream) InProgressBatch(ctx context.Context, ds []idem.Delivery) ([]int, error) {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Message().ID
	}
	s.b.mu.Lock()
	s.b.calls = append(s.b.calls, ids)
	fail, refuse, extra := s.b.fail, maps.Clone(s.b.refuse), slices.Clone(s.b.extra)
	s.b.fail = nil
	s.b.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	var stale, passed []int
	var inner []idem.Delivery
	for i, d := range ds {
		if refuse[ids[i]] {
			stale = append(stale, i)
			continue
		}
		passed = append(passed, i)
		inner = append(inner, d.(*recDelivery).Delivery)
	}
	innerStale, err := s.Stream.(idem.BatchRenewer).InProgressBatch(ctx, inner)
	if err != nil {
		return nil, err
	}
	for _, j := range innerStale {
		stale = append(stale, passed[j])
	}
	slices.Sort(stale)
	return append(stale, extra...), nil
}

// holdingN starts a consumer on cfg whose handler holds every message
// until the returned release, publishes evt-1 to evt-n, each of a key of
// its own, and waits until all n are in the consumer's memory, where the
// heartbeat looks.
func holdingN(t *testing.T, h *harness, cfg *consumer.Config, n int) (c *consumer.Consumer, release func()) {
	t.Helper()
	gate := make(chan struct{})
	c, _ = h.start(cfg, func(ctx context.Context, m idem.Message) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return h.apply(ctx, m)
	})
	release = sync.OnceFunc(func() { close(gate) })
	// Registered after the consumer's stop, so run before it.
	t.Cleanup(release)
	asked, next := h.rec.holdNext(n)
	t.Cleanup(next)
	for i := 1; i <= n; i++ {
		h.publish(msg(fmt.Sprintf("evt-%d", i), fmt.Sprintf("K%d", i)))
	}
	waitAsked(t, fmt.Sprintf("the consumer asking for more once it held %d messages", n), asked)
	return c, release
}

// beatOnce fires the heartbeat's next beat and waits until it has renewed
// what was due: it waits again.
func beatOnce(t *testing.T, h *harness, beat time.Duration) {
	t.Helper()
	waitFor(t, "the heartbeat waiting for its next beat", func() bool { return h.timers.Pending(beat) == 1 })
	h.timers.Advance(beat)
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
}

func sortedIDs(ids []string) []string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids
}

// On a stream that renews in batches (idem.BatchRenewer), the heartbeat
// renews every delivery due with one call a beat, and asks none of them
// on its own (Delivery.InProgress): N held deliveries cost one round trip
// a beat, not N, which on a loaded machine is what keeps the renewals
// within the AckWait. A beat with nothing due makes no call.
func TestHeartbeatRenewsEveryHeldDeliveryInOneCallABeat(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	b := &renewals{}
	h.rec.renewals = b
	cfg := h.config()
	const ackWait, beat, n = 40 * time.Second, 10 * time.Second, 5
	cfg.AckWait = ackWait
	c, release := holdingN(t, h, cfg, n)
	want := []string{"evt-1", "evt-2", "evt-3", "evt-4", "evt-5"}
	for i := 1; i <= 3; i++ {
		beatOnce(t, h, beat)
		calls := b.Calls()
		if len(calls) != i {
			t.Fatalf("after %d beats with %d deliveries held, InProgressBatch calls: %q; want one a beat", i, n, calls)
		}
		if got := sortedIDs(calls[i-1]); !slices.Equal(got, want) {
			t.Fatalf("beat %d renewed %q in one call, want every held delivery, %q", i, got, want)
		}
	}
	for _, id := range want {
		if k := countOp(h.rec.Ops(id), "in-progress"); k != 0 {
			t.Errorf("%s renewed on its own (InProgress) %d times; want only in the batches", id, k)
		}
	}
	release()
	waitFor(t, "every message processed", func() bool { return c.Stats().Processed == n })
	for _, id := range want {
		if k := countOp(h.rec.Ops(id), "deliver"); k != 1 {
			t.Errorf("%s delivered %d times, want once: a renewal came too late", id, k)
		}
	}
}

// Before anything is held, a beat has nothing to renew, and asks the
// transport nothing.
func TestHeartbeatWithNothingHeldMakesNoCall(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	b := &renewals{}
	h.rec.renewals = b
	cfg := h.config()
	const ackWait, beat = 40 * time.Second, 10 * time.Second
	cfg.AckWait = ackWait
	h.start(cfg, func(ctx context.Context, m idem.Message) error { return h.apply(ctx, m) })
	for range 2 {
		beatOnce(t, h, beat)
	}
	if calls := b.Calls(); len(calls) != 0 {
		t.Errorf("two beats with nothing held made InProgressBatch calls %q; want none", calls)
	}
}

// The deliveries a batch renewal answers stale, and those only, are marked
// so (the refusal is for good) and asked no more; the others of the same
// call are renewed at the next beat as before. Each refusal is logged at
// debug level with its message's ID, as InProgress's are.
func TestHeartbeatBatchMarksStaleOnlyWhatItRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	b := &renewals{refuse: map[string]bool{"evt-1": true, "evt-3": true}}
	h.rec.renewals = b
	logs := &debugRecords{}
	cfg := h.config()
	const ackWait, beat, n = 40 * time.Second, 10 * time.Second, 4
	cfg.AckWait, cfg.Logger = ackWait, slog.New(logs)
	holdingN(t, h, cfg, n)
	beatOnce(t, h, beat)
	beatOnce(t, h, beat)
	beatOnce(t, h, beat)
	calls := b.Calls()
	want := [][]string{{"evt-1", "evt-2", "evt-3", "evt-4"}, {"evt-2", "evt-4"}, {"evt-2", "evt-4"}}
	if len(calls) != len(want) {
		t.Fatalf("InProgressBatch calls over three beats, evt-1 and evt-3 answered stale at the first: %q; want %q", calls, want)
	}
	for i := range calls {
		if got := sortedIDs(calls[i]); !slices.Equal(got, want[i]) {
			t.Errorf("beat %d renewed %q, want %q: only the deliveries answered stale are asked no more", i+1, got, want[i])
		}
	}
	const failed = "in-progress heartbeat failed"
	var logged []string
	for _, r := range logs.find(failed) {
		if r["error"] == "" {
			t.Errorf("debug record %q without the error: %v", failed, r)
		}
		logged = append(logged, r["message_id"])
	}
	if slices.Sort(logged); !slices.Equal(logged, []string{"evt-1", "evt-3"}) {
		t.Errorf("debug records %q name messages %q; want evt-1 and evt-3, once each", failed, logged)
	}
}

// A batch renewal that fails as a whole (a transport failing for a while)
// says nothing of any delivery: none is marked stale, every one is renewed
// again at the next beat, and the failure is logged at debug level with
// the transport's error.
func TestHeartbeatBatchThatFailsAsksEveryDeliveryAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	b := &renewals{fail: errors.New("connection reset")}
	h.rec.renewals = b
	logs := &debugRecords{}
	cfg := h.config()
	const ackWait, beat, n = 40 * time.Second, 10 * time.Second, 3
	cfg.AckWait, cfg.Logger = ackWait, slog.New(logs)
	c, release := holdingN(t, h, cfg, n)
	beatOnce(t, h, beat)
	beatOnce(t, h, beat)
	calls := b.Calls()
	want := []string{"evt-1", "evt-2", "evt-3"}
	if len(calls) != 2 || !slices.Equal(sortedIDs(calls[0]), want) || !slices.Equal(sortedIDs(calls[1]), want) {
		t.Fatalf("InProgressBatch calls over two beats, the first failing (connection reset): %q; want %q at both", calls, want)
	}
	const failed = "in-progress heartbeat failed"
	if rs := logs.find(failed); len(rs) != 1 || !strings.Contains(rs[0]["error"], "connection reset") {
		t.Errorf("debug records %q: %v; want one, with the transport's error", failed, rs)
	}
	release()
	waitFor(t, "every message processed", func() bool { return c.Stats().Processed == n })
	for _, id := range want {
		if k := countOp(h.rec.Ops(id), "deliver"); k != 1 {
			t.Errorf("%s delivered %d times, want once: the renewal at the second beat came too late", id, k)
		}
	}
}

// Indexes a batch renewal returns that name no delivery of the call (a
// transport gone wrong) are passed over: the consumer neither fails nor
// marks anything for them.
func TestHeartbeatBatchPassesOverIndexesOutOfRange(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	b := &renewals{extra: []int{-1, 3, 4}}
	h.rec.renewals = b
	cfg := h.config()
	const ackWait, beat, n = 40 * time.Second, 10 * time.Second, 3
	cfg.AckWait = ackWait
	holdingN(t, h, cfg, n)
	beatOnce(t, h, beat)
	beatOnce(t, h, beat)
	calls := b.Calls()
	want := []string{"evt-1", "evt-2", "evt-3"}
	if len(calls) != 2 || !slices.Equal(sortedIDs(calls[1]), want) {
		t.Fatalf("InProgressBatch calls over two beats, the first answered with indexes out of range: %q; want %q at both", calls, want)
	}
}
