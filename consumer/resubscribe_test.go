package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/internal/eventually"
)

// flakySubscriber stands for a broker that is unreachable at first, and
// whose first stream then breaks after a few deliveries.
type flakySubscriber struct {
	idem.Subscriber
	failAfter int

	mu         sync.Mutex
	subscribes int
}

func (f *flakySubscriber) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	f.mu.Lock()
	f.subscribes++
	n := f.subscribes
	f.mu.Unlock()
	if n == 1 {
		return nil, errors.New("dial: connection refused")
	}
	s, err := f.Subscriber.Subscribe(ctx, sub)
	if err != nil || n > 2 {
		return s, err
	}
	return &breakingStream{Stream: s, left: f.failAfter}, nil
}

func (f *flakySubscriber) Subscribes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscribes
}

type breakingStream struct {
	idem.Stream
	mu   sync.Mutex
	left int
}

func (s *breakingStream) Next(ctx context.Context) (idem.Delivery, error) {
	s.mu.Lock()
	if s.left == 0 {
		s.mu.Unlock()
		return nil, errors.New("connection reset by peer")
	}
	s.left--
	s.mu.Unlock()
	return s.Stream.Next(ctx)
}

// A transport that fails, to subscribe or later, does not stop the
// consumer: it subscribes again after Resubscribe's delay, and every
// message is still applied once.
func TestRunSubscribesAgainAfterTransportFailures(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	flaky := &flakySubscriber{Subscriber: h.rec, failAfter: 3}
	cfg := h.config()
	cfg.Subscriber = flaky
	cfg.Resubscribe = idem.RetryPolicy{Base: time.Second, Cap: time.Second, Jitter: idem.NoJitter}
	const n = 10
	for i := range n {
		h.publish(msg(fmt.Sprintf("m-%d", i), ""))
	}
	_, stop := h.start(cfg, h.apply)
	h.advanceUntil("every message applied after two transport failures", 500*time.Millisecond, func() bool {
		for i := range n {
			if h.applied.Get(fmt.Sprintf("m-%d", i)) == 0 {
				return false
			}
		}
		return true
	})
	if s := flaky.Subscribes(); s != 3 {
		t.Errorf("Subscribe called %d times, want 3 (refused, broken, then good)", s)
	}
	for i := range n {
		if got := h.applied.Get(fmt.Sprintf("m-%d", i)); got != 1 {
			t.Errorf("m-%d applied %d times, want 1", i, got)
		}
	}
	stop() // and Run returns nil
}

// A closed transport or an invalid subscription ends Run with the error:
// subscribing again would not help.
func TestRunReturnsWhenTheTransportIsClosed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(h.config())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background(), h.apply) }()
	select {
	case err := <-done:
		if !errors.Is(err, idem.ErrClosed) {
			t.Errorf("Run on a closed transport = %v, want idem.ErrClosed", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run kept running on a closed transport")
	}
}

// Subscribed closes with the first subscription that succeeds, not with a
// refused one: a publisher that waits for it never publishes before the
// consumer's queue exists.
func TestSubscribedClosesWithTheFirstSubscription(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	flaky := &flakySubscriber{Subscriber: h.rec, failAfter: 100}
	cfg := h.config()
	cfg.Subscriber = flaky
	cfg.Resubscribe = idem.RetryPolicy{Base: time.Second, Cap: time.Second, Jitter: idem.NoJitter}
	c, stop := h.start(cfg, h.apply)
	defer stop()
	subscribed := func() bool {
		select {
		case <-c.Subscribed():
			return true
		default:
			return false
		}
	}
	eventually.True(t, waitLimit, "the first, refused, subscription", func() bool { return flaky.Subscribes() >= 1 })
	if subscribed() {
		t.Fatal("Subscribed closed after a refused subscription")
	}
	h.advanceUntil("the subscription that succeeds", 500*time.Millisecond, subscribed)
	if s := flaky.Subscribes(); s != 2 {
		t.Errorf("Subscribed closed after %d subscriptions, want 2", s)
	}
}

// scriptedSubscriber refuses its first refusals subscriptions; each later
// one gets a stream that runs until the test ends it.
type scriptedSubscriber struct {
	refusals int

	mu      sync.Mutex
	calls   int
	streams chan chan struct{} // each stream's end, handed to the test
}

func (s *scriptedSubscriber) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	s.mu.Lock()
	s.calls++
	n := s.calls
	s.mu.Unlock()
	if n <= s.refusals {
		return nil, errors.New("dial: connection refused")
	}
	end := make(chan struct{})
	s.streams <- end
	return endingStream{end}, nil
}

type endingStream struct{ end chan struct{} }

func (e endingStream) Next(ctx context.Context) (idem.Delivery, error) {
	select {
	case <-e.end:
		return nil, errors.New("connection reset by peer")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (endingStream) Close() error { return nil }

// waitsTimers passes AfterFunc to fakeTimers, and hands the test every wait
// but the heartbeat's.
type waitsTimers struct {
	*fakeTimers
	beat  time.Duration
	waits chan time.Duration
}

func (w waitsTimers) AfterFunc(d time.Duration, f func()) func() bool {
	stop := w.fakeTimers.AfterFunc(d, f)
	if d != w.beat {
		w.waits <- d
	}
	return stop
}

// Run's attempts to subscribe again back off by Resubscribe, one series
// of failures in a row: a stream that failed within a minute of its
// subscription continues the series, one that ran longer starts a new
// one.
func TestResubscribeBacksOffOneSeriesOfFailures(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	sub := &scriptedSubscriber{refusals: 3, streams: make(chan chan struct{}, 1)}
	timers := waitsTimers{fakeTimers: h.timers, beat: 30 * time.Second / 4, waits: make(chan time.Duration, 4)}
	cfg := h.config()
	cfg.Subscriber, cfg.Timers = sub, timers
	cfg.Resubscribe = idem.RetryPolicy{Base: time.Second, Cap: time.Hour, Jitter: idem.NoJitter}
	h.start(cfg, h.apply)
	next := func(what string) time.Duration {
		t.Helper()
		select {
		case d := <-timers.waits:
			return d
		case <-time.After(waitLimit):
			t.Fatalf("no wait before %s", what)
			return 0
		}
	}
	stream := func() chan struct{} {
		t.Helper()
		select {
		case end := <-sub.streams:
			return end
		case <-time.After(waitLimit):
			t.Fatal("Run did not subscribe again")
			return nil
		}
	}
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		if got := next("subscribing again"); got != want {
			t.Fatalf("after a refused subscription Run waits %s, want %s", got, want)
		}
		h.timers.Advance(want)
	}
	end := stream()
	h.clock.Advance(time.Minute)
	close(end)
	if got := next("subscribing after a stream that lasted a minute"); got != 8*time.Second {
		t.Fatalf("after a stream that failed a minute after its subscription Run waits %s, want 8s: the series goes on", got)
	}
	h.timers.Advance(8 * time.Second)
	end = stream()
	h.clock.Advance(time.Minute + time.Second)
	close(end)
	if got := next("subscribing after a stream that lasted over a minute"); got != time.Second {
		t.Fatalf("after a stream that ran over a minute Run waits %s, want 1s: a new series", got)
	}
}
