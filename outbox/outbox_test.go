package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/eventually"
	"github.com/idem-go/idem/outbox"
)

// recorder is a Publisher that remembers every message it was asked to
// publish, in order, before passing them on, and can be told to fail.
type recorder struct {
	next idem.Publisher

	mu    sync.Mutex
	msgs  []idem.Message
	calls int
	// failFirst makes the first failFirst calls fail without publishing.
	failFirst int
}

var errBroker = errors.New("broker unavailable")

func (r *recorder) Publish(ctx context.Context, msgs ...idem.Message) error {
	r.mu.Lock()
	r.calls++
	if r.calls <= r.failFirst {
		r.mu.Unlock()
		return errBroker
	}
	r.msgs = append(r.msgs, msgs...)
	r.mu.Unlock()
	if r.next == nil {
		return nil
	}
	return r.next.Publish(ctx, msgs...)
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		out = append(out, m.ID)
	}
	return out
}

func (r *recorder) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func msg(i int) idem.Message {
	return idem.Message{
		ID:      fmt.Sprintf("evt-%04d", i),
		Topic:   "payments.succeeded",
		Key:     fmt.Sprintf("acct-%d", i%7),
		Headers: map[string]string{"n": fmt.Sprint(i)},
		Payload: fmt.Appendf(nil, `{"n":%d}`, i),
	}
}

func addN(t *testing.T, ob idem.Outbox, from, to int) []string {
	t.Helper()
	var ids []string
	for i := from; i < to; i++ {
		if err := ob.Add(context.Background(), msg(i)); err != nil {
			t.Fatalf("Add: %v", err)
		}
		ids = append(ids, msg(i).ID)
	}
	return ids
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, 10*time.Second, what, cond)
}

// drain reads n messages of topic from the transport, as consumer name.
func drain(t *testing.T, tr *idemmem.Transport, consumer string, n int) []idem.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments.succeeded", Consumer: consumer})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer s.Close()
	var out []idem.Message
	for len(out) < n {
		d, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d messages: %v", len(out), err)
		}
		out = append(out, d.Message())
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	return out
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	ob, tr := idemmem.NewOutbox(nil), idemmem.NewTransport(nil)
	for _, tc := range []struct {
		name string
		cfg  *outbox.Config
	}{
		{"nil config", nil},
		{"no outbox", &outbox.Config{Publisher: tr}},
		{"no publisher", &outbox.Config{Outbox: ob}},
		{"negative batch", &outbox.Config{Outbox: ob, Publisher: tr, Batch: -1}},
		{"negative lease", &outbox.Config{Outbox: ob, Publisher: tr, Lease: -time.Second}},
		{"negative interval", &outbox.Config{Outbox: ob, Publisher: tr, Interval: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := outbox.New(tc.cfg); !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("New: got %v, want ErrInvalidArgument", err)
			}
		})
	}
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: tr})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if r.Name() == "" {
		t.Fatal("default Name is empty")
	}
}

func TestFlushPublishesInOrderWithIDs(t *testing.T) {
	t.Parallel()
	ob, tr := idemmem.NewOutbox(nil), idemmem.NewTransport(nil)
	defer tr.Close()
	want := addN(t, ob, 0, 25)
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: tr, Batch: 10})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, wantN := range []int{10, 10, 5, 0} {
		n, err := r.Flush(context.Background())
		if err != nil {
			t.Fatalf("Flush: %v", err)
		}
		if n != wantN {
			t.Fatalf("Flush published %d, want %d", n, wantN)
		}
		total += n
	}
	if ob.Unsent() != 0 {
		t.Fatalf("%d entries unsent after flushing", ob.Unsent())
	}
	got := drain(t, tr, "check", total)
	for i, m := range got {
		w := msg(i)
		if m.ID != want[i] || string(m.Payload) != string(w.Payload) || m.Key != w.Key || m.Headers["n"] != w.Headers["n"] {
			t.Fatalf("message %d: got %+v, want %+v", i, m, w)
		}
	}
}

func TestTwoRelaysPublishEachRowOnce(t *testing.T) {
	t.Parallel()
	ob, tr := idemmem.NewOutbox(nil), idemmem.NewTransport(nil)
	defer tr.Close()
	rec := &recorder{next: tr}
	want := addN(t, ob, 0, 500)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	relays := make([]*outbox.Relay, 2)
	for i := range relays {
		r, err := outbox.New(&outbox.Config{
			Outbox: ob, Publisher: rec, Name: fmt.Sprintf("relay-%d", i),
			Batch: 17, Interval: time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	// Half the rows arrive while the relays run.
	want = append(want, addN(t, ob, 500, 1000)...)
	for _, r := range relays {
		r.Wake()
	}
	waitFor(t, "the outbox to empty", func() bool { return ob.Unsent() == 0 })
	cancel()
	wg.Wait()

	got := rec.ids()
	counts := make(map[string]int)
	for _, id := range got {
		counts[id]++
	}
	for _, id := range want {
		if counts[id] != 1 {
			t.Errorf("%s published %d times, want once", id, counts[id])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("published %d messages, want %d", len(got), len(want))
	}
	if n := len(drain(t, tr, "check", len(want))); n != len(want) {
		t.Fatalf("transport holds %d, want %d", n, len(want))
	}
}

// forgetfulOutbox loses its relay's MarkSent calls, as a relay that dies
// between publishing and marking does.
type forgetfulOutbox struct{ *idemmem.Outbox }

func (forgetfulOutbox) MarkSent(context.Context, ...int64) error { return nil }

func TestCrashBeforeMarkSentRepublishesAfterLease(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ob := idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock})
	rec := &recorder{}
	want := addN(t, ob, 0, 3)
	crashing, err := outbox.New(&outbox.Config{Outbox: forgetfulOutbox{ob}, Publisher: rec, Name: "a", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	other, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec, Name: "b", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n, err := crashing.Flush(ctx); n != 3 || err != nil {
		t.Fatalf("crashing Flush: %d, %v", n, err)
	}
	if n, err := other.Flush(ctx); n != 0 || err != nil {
		t.Fatalf("Flush under a live lease: %d, %v; want nothing", n, err)
	}
	clock.Advance(time.Minute + time.Second)
	if n, err := other.Flush(ctx); n != 3 || err != nil {
		t.Fatalf("Flush after the lease: %d, %v; want 3", n, err)
	}
	if ob.Unsent() != 0 {
		t.Fatalf("%d unsent", ob.Unsent())
	}
	wantIDs := append(slices.Clone(want), want...)
	if got := rec.ids(); !slices.Equal(got, wantIDs) {
		t.Fatalf("published %v, want %v (each twice, same IDs)", got, wantIDs)
	}
}

func TestPublishFailureKeepsBatch(t *testing.T) {
	t.Parallel()
	ob := idemmem.NewOutbox(nil)
	rec := &recorder{failFirst: 2}
	addN(t, ob, 0, 5)
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec, Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		if n, err := r.Flush(ctx); !errors.Is(err, errBroker) || n != 0 {
			t.Fatalf("Flush %d: %d, %v; want the broker's error", i, n, err)
		}
		if ob.Unsent() != 5 {
			t.Fatalf("%d unsent after a failed publish, want 5", ob.Unsent())
		}
	}
	// More entries arrive meanwhile; the failed batch still goes first.
	addN(t, ob, 5, 6)
	for _, wantN := range []int{3, 3, 0} {
		if n, err := r.Flush(ctx); n != wantN || err != nil {
			t.Fatalf("Flush: %d, %v; want %d", n, err, wantN)
		}
	}
	want := []string{"evt-0000", "evt-0001", "evt-0002", "evt-0003", "evt-0004", "evt-0005"}
	if got := rec.ids(); !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}

// flakyMarkOutbox fails its first MarkSent.
type flakyMarkOutbox struct {
	*idemmem.Outbox
	failed atomic.Bool
}

func (o *flakyMarkOutbox) MarkSent(ctx context.Context, seqs ...int64) error {
	if o.failed.CompareAndSwap(false, true) {
		return errors.New("database unavailable")
	}
	return o.Outbox.MarkSent(ctx, seqs...)
}

func TestMarkSentFailureRetriedAlone(t *testing.T) {
	t.Parallel()
	ob := &flakyMarkOutbox{Outbox: idemmem.NewOutbox(nil)}
	rec := &recorder{}
	want := addN(t, ob, 0, 4)
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Flush(context.Background()); err == nil {
		t.Fatal("Flush succeeded although MarkSent failed")
	}
	if n, err := r.Flush(context.Background()); n != 4 || err != nil {
		t.Fatalf("second Flush: %d, %v", n, err)
	}
	if got := rec.ids(); !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v once each", got, want)
	}
	if ob.Unsent() != 0 {
		t.Fatalf("%d unsent", ob.Unsent())
	}
}

func TestRunRetriesFailedPublish(t *testing.T) {
	t.Parallel()
	ob := idemmem.NewOutbox(nil)
	rec := &recorder{failFirst: 3}
	want := addN(t, ob, 0, 10)
	r, err := outbox.New(&outbox.Config{
		Outbox: ob, Publisher: rec, Interval: time.Millisecond,
		Retry: idem.RetryPolicy{Base: time.Millisecond, Cap: 2 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "the outbox to empty", func() bool { return ob.Unsent() == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := rec.ids(); !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	if c := rec.callCount(); c < 4 {
		t.Fatalf("%d publish calls, want at least 4 (3 failures)", c)
	}
}

// claimCounter counts Claim calls.
type claimCounter struct {
	*idemmem.Outbox
	claims atomic.Int32
}

func (o *claimCounter) Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	o.claims.Add(1)
	return o.Outbox.Claim(ctx, relay, limit, lease)
}

func TestWakeCutsThePollShort(t *testing.T) {
	t.Parallel()
	ob := &claimCounter{Outbox: idemmem.NewOutbox(nil)}
	rec := &recorder{}
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "the first pass", func() bool { return ob.claims.Load() >= 1 })
	addN(t, ob, 0, 1)
	r.Wake()
	waitFor(t, "the woken pass to publish", func() bool { return len(rec.ids()) == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	ob := &claimCounter{Outbox: idemmem.NewOutbox(nil)}
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "the first pass", func() bool { return ob.claims.Load() >= 1 })
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if err := r.Run(stopped); !errors.Is(err, outbox.ErrRunning) {
		t.Fatalf("second Run: got %v, want ErrRunning", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// mover is a Publisher that moves its own outbox's entries (as a database
// transport does in its database), and refuses any other outbox.
type mover struct {
	*recorder
	own   idem.Outbox
	moves int
}

func (m *mover) MoveOutbox(ctx context.Context, ob idem.Outbox, limit int) (int, bool, error) {
	if ob != m.own {
		return 0, false, nil
	}
	m.moves++
	entries, err := ob.Claim(ctx, "mover", limit, time.Minute)
	if err != nil || len(entries) == 0 {
		return 0, true, err
	}
	msgs := make([]idem.Message, len(entries))
	seqs := make([]int64, len(entries))
	for i, e := range entries {
		msgs[i], seqs[i] = e.Message, e.Seq
	}
	if err := m.recorder.Publish(ctx, msgs...); err != nil {
		return 0, true, err
	}
	return len(entries), true, ob.MarkSent(ctx, seqs...)
}

func TestFlushMovesThroughAnOutboxMover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ob, tr := idemmem.NewOutbox(nil), idemmem.NewTransport(nil)
	defer tr.Close()
	m := &mover{recorder: &recorder{next: tr}, own: ob}
	want := addN(t, ob, 0, 250)
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: m, Batch: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{100, 100, 50, 0} {
		if got, err := r.Flush(ctx); got != n || err != nil {
			t.Fatalf("Flush = %d, %v; want %d moved", got, err, n)
		}
	}
	if m.moves != 4 || !slices.Equal(m.ids(), want) {
		t.Errorf("%d moves published %v, want 4 moves of %v in order", m.moves, m.ids(), want)
	}

	// Another outbox is relayed the long way, and the mover is not asked
	// again.
	other := idemmem.NewOutbox(nil)
	m2 := &mover{recorder: &recorder{next: tr}, own: ob}
	r2, err := outbox.New(&outbox.Config{Outbox: other, Publisher: m2})
	if err != nil {
		t.Fatal(err)
	}
	more := addN(t, other, 250, 260)
	for range 2 {
		if _, err := r2.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if m2.moves != 0 || !slices.Equal(m2.ids(), more) || other.Unsent() != 0 {
		t.Errorf("moves %d, published %v, unsent %d; want the long way: 0 moves, %v, 0 unsent", m2.moves, m2.ids(), other.Unsent(), more)
	}
}
