package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// A delivery the consumer holds is renewed (InProgress) at every beat of
// its heartbeat, a quarter of AckWait, once its last renewal is a beat old:
// so that a delivery survives three late or lost beats (a loaded machine)
// before its AckWait ends and the transport hands it out again. Each beat
// here moves the clock by exactly a beat.
func TestHeartbeatRenewsAHeldDeliveryAtEveryBeat(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	const ackWait, beat = 40 * time.Second, 10 * time.Second
	cfg.Concurrency, cfg.AckWait = 1, ackWait
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("evt-1", "K"))
	// Its handler running, evt-1 is in the consumer's memory, where the
	// heartbeat looks: taken from the transport, it may not be yet.
	waitClosed(t, "evt-1's handler", started)
	for i := 1; i <= 6; i++ {
		waitFor(t, "the heartbeat waiting for its next beat", func() bool { return h.timers.Pending(beat) == 1 })
		h.timers.Advance(beat)
		// The heartbeat renews what is due before it waits again.
		waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
		if n := countOp(h.rec.Ops("evt-1"), "in-progress"); n != i {
			t.Fatalf("after %d beats of %s, evt-1 renewed %d times; want once a beat", i, beat, n)
		}
	}
	close(release)
	waitFor(t, "evt-1 processed", func() bool { return c.Stats().Processed == 1 })
	if n := countOp(h.rec.Ops("evt-1"), "deliver"); n != 1 {
		t.Errorf("evt-1 delivered %d times, want once: a renewal came too late", n)
	}
}

// debugRecords keeps the records logged at debug level: their message and
// string attributes.
type debugRecords struct {
	mu      sync.Mutex
	records []map[string]string
}

func (l *debugRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *debugRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *debugRecords) WithGroup(string) slog.Handler            { return l }
func (l *debugRecords) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelDebug {
		return nil
	}
	rec := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool {
		rec[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, rec)
	return nil
}

func (l *debugRecords) find(msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.records {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// A heartbeat the transport refuses while the consumer runs (here the
// delivery's AckWait ended before the beat came: a stalled process) is
// logged at debug level with the message's ID and the transport's error,
// which is what tells an operator why a message was delivered again.
func TestFailedHeartbeatIsLogged(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	logs := &debugRecords{}
	cfg := h.config()
	const ackWait, beat = 40 * time.Second, 10 * time.Second
	cfg.Concurrency, cfg.AckWait, cfg.Logger = 1, ackWait, slog.New(logs)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.start(cfg, func(ctx context.Context, m idem.Message) error {
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-ctx.Done():
		}
		return errors.New("stopped")
	})
	defer close(release)
	h.publish(msg("evt-1", "K"))
	// Its handler running, evt-1 is in the consumer's memory, where the
	// heartbeat looks: taken from the transport, it may not be yet.
	waitClosed(t, "evt-1's handler", started)
	waitFor(t, "the heartbeat waiting for its beat", func() bool { return h.timers.Pending(beat) == 1 })
	// The clock passes AckWait before the beat fires.
	h.clock.Advance(ackWait + time.Second)
	h.timers.Advance(0)
	// The heartbeat logs what failed before it waits again.
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	const failed = "in-progress heartbeat failed"
	rs := logs.find(failed)
	if len(rs) != 1 || rs[0]["message_id"] != "evt-1" || rs[0]["error"] == "" {
		t.Errorf("debug records %q: %v; want one, with message_id evt-1 and the transport's error", failed, rs)
	}
	if ops := h.rec.Ops("evt-1"); countOp(ops, "in-progress") == 0 {
		t.Errorf("evt-1's deliveries: %v; want the heartbeat's InProgress asked", ops)
	}
}

// A delivery's renewals are counted from when the transport handed it out
// (Next returned), where the transport starts its AckWait, not from when
// the consumer put it behind its key: a reader slow between the two (a
// DedupKey that takes its time, a loaded machine) must not push the first
// renewal past the AckWait's end. Here the reader is held at evt-1's dedup
// key while the clock moves past half the AckWait (to +25s of 40s), at
// which the beat at +30s is the last before the transport hands evt-1 out
// again at +40s.
func TestHeartbeatCountsFromWhenTheTransportHandedTheDeliveryOut(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	const ackWait, beat = 40 * time.Second, 10 * time.Second
	cfg.Concurrency, cfg.AckWait = 1, ackWait
	taken, admit := make(chan struct{}), make(chan struct{})
	var takenOnce, admitOnce sync.Once
	cfg.DedupKey = func(m idem.Message) (string, error) {
		takenOnce.Do(func() {
			close(taken)
			<-admit
		})
		return m.ID, nil
	}
	started, release := make(chan struct{}), make(chan struct{})
	var startedOnce sync.Once
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		startedOnce.Do(func() { close(started) })
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return h.apply(ctx, m)
	})
	t.Cleanup(func() { admitOnce.Do(func() { close(admit) }) })
	waitFor(t, "the heartbeat waiting for its first beat", func() bool { return h.timers.Pending(beat) == 1 })
	h.publish(msg("evt-1", "K"))
	// Handed out at +0s: its AckWait ends at +40s unless renewed.
	waitClosed(t, "evt-1 taken, its dedup key asked", taken)
	for range 2 {
		h.timers.Advance(beat)
		waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	}
	h.clock.Advance(5 * time.Second)
	admitOnce.Do(func() { close(admit) })
	waitClosed(t, "evt-1's handler", started)
	// The beat at +30s, evt-1 then 30s out of the transport's hands
	// unrenewed.
	h.timers.Advance(beat - 5*time.Second)
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	if n := countOp(h.rec.Ops("evt-1"), "in-progress"); n != 1 {
		t.Fatalf("evt-1, handed out at +0s and put in memory at +25s, renewed %d times by the beat at +30s; "+
			"want once, before its AckWait (%s from when it was handed out) ends", n, ackWait)
	}
	// Past the AckWait's first end: still the consumer's own.
	h.timers.Advance(beat)
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	close(release)
	waitFor(t, "evt-1 processed", func() bool { return c.Stats().Processed == 1 })
	if ops := h.rec.Ops("evt-1"); countOp(ops, "deliver") != 1 {
		t.Errorf("evt-1's deliveries: %v; want one: a renewal came too late", ops)
	}
}

// A renewal refused for another reason than a stale delivery (a transport
// failing for a while) leaves the delivery the consumer's own: it is
// renewed again at the next beat, where one refused as stale is not (the
// refusal is for good).
func TestHeartbeatRenewsAgainAfterAFailureThatIsNotStale(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	sub := &perDelivery{Subscriber: h.tr, refuse: errors.New("connection reset")}
	h.rec.Subscriber = sub
	cfg := h.config()
	const ackWait, beat = 40 * time.Second, 10 * time.Second
	cfg.Concurrency, cfg.AckWait = 1, ackWait
	g := newGate()
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		g.hold()
		return h.apply(ctx, m)
	})
	// Registered after the consumer's stop, so run before it.
	release := sync.OnceFunc(g.release)
	t.Cleanup(release)
	h.publish(msg("evt-1", "K"))
	// Its handler running, evt-1 is in the consumer's memory, where the
	// heartbeat looks.
	g.wait(t, "evt-1's handler")
	for range 2 {
		waitFor(t, "the heartbeat waiting for its next beat", func() bool { return h.timers.Pending(beat) == 1 })
		h.timers.Advance(beat)
		// The heartbeat renews what is due before it waits again.
		waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	}
	if dc := sub.calls("evt-1", 1); dc.inProgress != 2 || dc.stale {
		t.Errorf("evt-1's delivery after two beats, the first refused (connection reset): %+v; want renewed at both", dc)
	}
	release()
	waitFor(t, "evt-1 processed", func() bool { return c.Stats().Processed == 1 })
	if n := countOp(h.rec.Ops("evt-1"), "deliver"); n != 1 {
		t.Errorf("evt-1 delivered %d times, want once: a renewal came too late", n)
	}
}
