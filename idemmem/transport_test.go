package idemmem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// fixture is a transport on a manual clock with one subscription.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	clock *idemmem.Clock
	tr    *idemmem.Transport
}

func newFixture(t *testing.T) *fixture {
	clock := idemmem.NewClock(start)
	tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock, AckWait: time.Minute, Poll: time.Millisecond})
	t.Cleanup(func() { _ = tr.Close() })
	return &fixture{t: t, ctx: t.Context(), clock: clock, tr: tr}
}

func (f *fixture) subscribe(sub idem.Subscription) idem.Stream {
	f.t.Helper()
	if sub.Topic == "" {
		sub.Topic = "t"
	}
	if sub.Consumer == "" {
		sub.Consumer = "c"
	}
	s, err := f.tr.Subscribe(f.ctx, sub)
	if err != nil {
		f.t.Fatalf("Subscribe: %v", err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}

func (f *fixture) publish(ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		if err := f.tr.Publish(f.ctx, idem.Message{ID: id, Topic: "t"}); err != nil {
			f.t.Fatalf("Publish(%q): %v", id, err)
		}
	}
}

func (f *fixture) next(s idem.Stream, want string) idem.Delivery {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		f.t.Fatalf("Next, waiting for %q: %v", want, err)
	}
	if d.Message().ID != want {
		f.t.Fatalf("Next = %q, want %q", d.Message().ID, want)
	}
	return d
}

func (f *fixture) none(s idem.Stream) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 50*time.Millisecond)
	defer cancel()
	if d, err := s.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			f.t.Fatalf("Next = %q, want nothing", d.Message().ID)
		}
		f.t.Fatalf("Next = %v, want context.DeadlineExceeded", err)
	}
}

func TestSettleTwice(t *testing.T) {
	t.Parallel()
	for name, settle := range map[string]func(context.Context, idem.Delivery) error{
		"ack":  func(ctx context.Context, d idem.Delivery) error { return d.Ack(ctx) },
		"nack": func(ctx context.Context, d idem.Delivery) error { return d.Nack(ctx, time.Hour) },
		"term": func(ctx context.Context, d idem.Delivery) error { return d.Term(ctx) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			s := f.subscribe(idem.Subscription{})
			f.publish("m1")
			d := f.next(s, "m1")
			if err := settle(f.ctx, d); err != nil {
				t.Fatalf("first %s: %v", name, err)
			}
			for what, err := range map[string]error{
				"Ack":        d.Ack(f.ctx),
				"Nack":       d.Nack(f.ctx, 0),
				"Term":       d.Term(f.ctx),
				"InProgress": d.InProgress(f.ctx),
			} {
				if !errors.Is(err, idemmem.ErrStaleDelivery) {
					t.Errorf("%s after %s = %v, want ErrStaleDelivery", what, name, err)
				}
			}
		})
	}
}

func TestStaleAfterRedelivery(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{})
	f.publish("m1")
	first := f.next(s, "m1")
	f.clock.Advance(time.Minute) // AckWait ends
	// InProgress cannot take back a delivery whose AckWait has ended: it
	// may already be on its way to another holder.
	if err := first.InProgress(f.ctx); !errors.Is(err, idemmem.ErrStaleDelivery) {
		t.Errorf("InProgress after AckWait = %v, want ErrStaleDelivery", err)
	}
	second := f.next(s, "m1")
	if second.Attempt() != 2 {
		t.Errorf("Attempt = %d, want 2", second.Attempt())
	}
	if err := first.Ack(f.ctx); !errors.Is(err, idemmem.ErrStaleDelivery) {
		t.Errorf("Ack of the first delivery after a redelivery = %v, want ErrStaleDelivery", err)
	}
	if err := second.Ack(f.ctx); err != nil {
		t.Errorf("Ack of the current delivery: %v", err)
	}
}

func TestLateAckAfterAckWait(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{})
	f.publish("m1", "m2")
	d := f.next(s, "m1")
	f.clock.Advance(2 * time.Minute)
	// The AckWait ended but no one took m1 again: the Ack still settles it.
	if err := d.Ack(f.ctx); err != nil {
		t.Fatalf("late Ack: %v", err)
	}
	f.next(s, "m2")
}

func TestAckAfterStreamClose(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{})
	f.publish("m1", "m2")
	d := f.next(s, "m1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A handler finishing after its stream closed still settles.
	if err := d.Ack(f.ctx); err != nil {
		t.Fatalf("Ack after the stream closed: %v", err)
	}
	s2 := f.subscribe(idem.Subscription{})
	f.next(s2, "m2")
}

func TestCloseGivesBackAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{})
	f.publish("m1")
	f.next(s, "m1")
	_ = s.Close()
	// No clock move: the closed stream gave the message back.
	d := f.next(f.subscribe(idem.Subscription{}), "m1")
	if d.Attempt() != 2 {
		t.Errorf("Attempt = %d, want 2", d.Attempt())
	}
}

func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{MaxInFlight: 2})
	f.publish("m1", "m2", "m3")
	d1 := f.next(s, "m1")
	f.next(s, "m2")
	f.none(s)
	if err := d1.Ack(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.next(s, "m3")
}

func TestCompetingStreams(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.subscribe(idem.Subscription{}), f.subscribe(idem.Subscription{})
	f.publish("m1", "m2")
	f.next(a, "m1")
	f.next(b, "m2") // one consumer name: each message goes to one stream
	f.none(a)
	f.none(b)
}

func TestPublishBeforeSubscribe(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.publish("m1")
	d := f.next(f.subscribe(idem.Subscription{}), "m1")
	if !d.Message().Time.Equal(start) {
		t.Errorf("Time = %v, want the clock's %v", d.Message().Time, start)
	}
}

func TestTransportClose(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{})
	f.publish("m1")
	d := f.next(s, "m1")
	if err := f.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := f.tr.Publish(f.ctx, idem.Message{ID: "m2", Topic: "t"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	if _, err := f.tr.Subscribe(f.ctx, idem.Subscription{Topic: "t", Consumer: "c"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Next(f.ctx); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Next after Close = %v, want ErrClosed", err)
	}
	if err := d.Ack(f.ctx); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Ack after Close = %v, want ErrClosed", err)
	}
}

func TestSubscribeInvalid(t *testing.T) {
	t.Parallel()
	tr := idemmem.NewTransport(nil)
	for name, sub := range map[string]idem.Subscription{
		"negative AckWait":     {Topic: "t", Consumer: "c", AckWait: -time.Second},
		"negative MaxInFlight": {Topic: "t", Consumer: "c", MaxInFlight: -1},
	} {
		if _, err := tr.Subscribe(t.Context(), sub); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Subscribe(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// passedDeadline is a context whose deadline has passed while its Err does
// not say so yet: a context's deadline ends it through a timer, which a
// loaded machine runs late.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A Next whose deadline has passed hands nothing out, even before its
// context says it ended: its caller has stopped waiting, and a message
// handed out then would count an attempt (and hold the message for an
// AckWait) for nobody, or reach a caller that wanted nothing by then (the
// suite's real-time NackDelay: "want nothing: the Nack delay has not
// passed").
func TestNextAfterItsDeadlineHandsNothingOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.subscribe(idem.Subscription{})
	f.publish("m1")
	if d, err := s.Next(passedDeadline{f.ctx}); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			t.Fatalf("Next past its deadline = %q (attempt %d), want context.DeadlineExceeded", d.Message().ID, d.Attempt())
		}
		t.Fatalf("Next past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if d := f.next(s, "m1"); d.Attempt() != 1 {
		t.Fatalf("m1 then came as attempt %d, want 1: the Next past its deadline counted one", d.Attempt())
	}
}
