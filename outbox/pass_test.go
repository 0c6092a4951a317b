package outbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/outbox"
)

// waitTimers are idem.Timers that never fire: they write down each wait
// asked of them and signal it, so a test sees how long Run means to sleep.
type waitTimers struct {
	mu    sync.Mutex
	waits []time.Duration
	asked chan struct{}
}

func (w *waitTimers) AfterFunc(d time.Duration, _ func()) func() bool {
	w.mu.Lock()
	w.waits = append(w.waits, d)
	w.mu.Unlock()
	select {
	case w.asked <- struct{}{}:
	default:
	}
	return func() bool { return true }
}

func (w *waitTimers) first() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waits[0]
}

// An idle relay polls every Interval: one second when Interval is left
// zero, and the configured Interval otherwise.
func TestRunPollsEveryInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     time.Duration
	}{
		{"default", 0, time.Second},
		{"configured", 5 * time.Second, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			timers := &waitTimers{asked: make(chan struct{}, 1)}
			r, err := outbox.New(&outbox.Config{Outbox: idemmem.NewOutbox(nil), Publisher: &recorder{},
				Interval: tc.interval, Timers: timers})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			select {
			case <-timers.asked:
			case <-time.After(10 * time.Second):
				t.Fatal("Run never waited after its first, empty, pass")
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := timers.first(); got != tc.want {
				t.Fatalf("an idle relay waits %s between polls, want %s", got, tc.want)
			}
		})
	}
}

// passes is an Observer that keeps every Pass it is told of.
type passes struct {
	mu sync.Mutex
	ps []outbox.Pass
}

func (o *passes) Pass(_ context.Context, p outbox.Pass) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ps = append(o.ps, p)
}

// The Observer is told of every pass that published or failed, with what it
// published, how many entries it marked sent and why it failed; an empty
// pass is not reported.
func TestObserverSeesEachPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ob := idemmem.NewOutbox(nil)
	obs := &passes{}
	rec := &recorder{failFirst: 1}
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec, Name: "relay-a", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Flush(ctx); n != 0 || err != nil {
		t.Fatalf("Flush of an empty outbox = %d, %v", n, err)
	}
	want := addN(t, ob, 0, 3)
	if _, err := r.Flush(ctx); !errors.Is(err, errBroker) {
		t.Fatalf("Flush with the broker down: %v, want %v", err, errBroker)
	}
	if n, err := r.Flush(ctx); n != 3 || err != nil {
		t.Fatalf("Flush = %d, %v; want 3 sent", n, err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.ps) != 2 {
		t.Fatalf("observed %d passes (%+v), want 2: the failed one and the one that sent", len(obs.ps), obs.ps)
	}
	ids := func(ms []idem.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.ID)
		}
		return out
	}
	failed, sent := obs.ps[0], obs.ps[1]
	if !errors.Is(failed.Err, errBroker) || failed.Sent != 0 || !slices.Equal(ids(failed.Messages), want) || failed.Relay != "relay-a" {
		t.Errorf("failed pass: %+v; want Err %v, Sent 0, Messages %v, Relay relay-a", failed, errBroker, want)
	}
	if sent.Err != nil || sent.Sent != 3 || !slices.Equal(ids(sent.Messages), want) || sent.Oldest.IsZero() || sent.Moved {
		t.Errorf("sent pass: %+v; want Sent 3, Messages %v, its Oldest set, not Moved", sent, want)
	}
}

// firingTimers are idem.Timers that fire at once any wait shorter than an
// hour (longer ones never), and write down each wait asked of them.
type firingTimers struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (f *firingTimers) AfterFunc(d time.Duration, fn func()) func() bool {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	if d < time.Hour {
		go fn()
	}
	return func() bool { return false }
}

func (f *firingTimers) asked() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.waits)
}

// Failed passes in a row back off exponentially, by the Retry policy, and
// a pass that succeeds starts the series again.
func TestRunBacksOffFailedPassesInARow(t *testing.T) {
	t.Parallel()
	ob := idemmem.NewOutbox(nil)
	rec := &recorder{failFirst: 3}
	addN(t, ob, 0, 1)
	timers := &firingTimers{}
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec, Interval: time.Hour, Timers: timers,
		Retry: idem.RetryPolicy{Base: time.Second, Cap: time.Minute, Jitter: idem.NoJitter}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "three failed passes and the poll after the fourth", func() bool { return len(timers.asked()) >= 4 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, time.Hour}
	if got := timers.asked()[:4]; !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v: three failures backing off, then the poll Interval", got, want)
	}
}

// A pass that relayed a full batch is followed at once by another, without
// waiting for Interval: a backlog drains at the speed of the broker.
func TestRunDrainsABacklogWithoutWaiting(t *testing.T) {
	t.Parallel()
	ob := idemmem.NewOutbox(nil)
	rec := &recorder{}
	want := addN(t, ob, 0, 5)
	timers := &waitTimers{asked: make(chan struct{}, 1)}
	r, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: rec, Batch: 2, Interval: time.Hour, Timers: timers})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-timers.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("Run never waited")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := rec.ids(); !slices.Equal(got, want) {
		t.Fatalf("published %v before the first wait, want the whole backlog %v", got, want)
	}
}

// Observers skips nil observers: with none left it is nil, and with one
// left it is that one.
func TestObserversSkipsNil(t *testing.T) {
	t.Parallel()
	if o := outbox.Observers(nil, nil); o != nil {
		t.Errorf("Observers(nil, nil) = %v, want nil", o)
	}
	p := &passes{}
	if o := outbox.Observers(nil, p, nil); o != outbox.Observer(p) {
		t.Errorf("Observers(nil, p, nil) = %v, want p itself", o)
	}
}
