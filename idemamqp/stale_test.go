package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
)

// Once the channel a delivery came on has closed, its delivery tag means
// nothing: the broker has put the message back in the queue, and the
// stream, subscribing anew, delivers it again on a new channel. Ack, Nack
// (with and without a delay), Term and InProgress of the old deliveries
// answer ErrStaleDelivery and change nothing: each message comes again
// once, a delayed Nack's copy included, and its new delivery settles it.
func TestClosedChannelDeliveriesAreStale(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "t", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ids := []string{"m1", "m2", "m3", "m4", "m5"}
	for _, id := range ids {
		if err := tr.Publish(t.Context(), idem.Message{ID: id, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	old := make(map[string]idem.Delivery)
	for range ids {
		d := next(t, s)
		old[d.Message().ID] = d
	}

	closed, err := idemamqp.BreakChannel(s)
	if err != nil {
		t.Fatalf("acknowledging an unknown tag: %v", err)
	}
	select {
	case e := <-closed:
		t.Logf("the broker closed the channel: %v", e)
	case <-time.After(10 * time.Second):
		t.Fatal("the broker did not close the channel within 10s")
	}

	ctx := t.Context()
	for id, settle := range map[string]func(d idem.Delivery) error{
		"m1": func(d idem.Delivery) error { return d.Ack(ctx) },
		"m2": func(d idem.Delivery) error { return d.Nack(ctx, 0) },
		"m3": func(d idem.Delivery) error { return d.Nack(ctx, 20*time.Millisecond) },
		"m4": func(d idem.Delivery) error { return d.Term(ctx) },
		"m5": func(d idem.Delivery) error { return d.InProgress(ctx) },
	} {
		if err := settle(old[id]); !errors.Is(err, idem.ErrStaleDelivery) || !errors.Is(err, idemamqp.ErrStaleDelivery) {
			t.Errorf("%s, of the closed channel: settled with %v, want an error matching ErrStaleDelivery", id, err)
		}
	}
	if err := old["m1"].Ack(ctx); !errors.Is(err, idem.ErrStaleDelivery) {
		t.Errorf("m1's Ack again: %v, want ErrStaleDelivery", err)
	}

	// Each message comes again, once, on the stream's new channel, where
	// its delivery settles it.
	seen := make(map[string]int)
	for range ids {
		d := next(t, s)
		seen[d.Message().ID]++
		if d.Attempt() != 2 {
			t.Errorf("%s delivered again: Attempt = %d, want 2", d.Message().ID, d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Errorf("Ack of %s's new delivery: %v", d.Message().ID, err)
		}
	}
	if want := fmt.Sprint(map[string]int{"m1": 1, "m2": 1, "m3": 1, "m4": 1, "m5": 1}); fmt.Sprint(seen) != want {
		t.Errorf("delivered again: %v, want %v", seen, want)
	}
	// A delayed Nack's copy would come 20ms after it; nothing comes.
	wait, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if d, err := s.Next(wait); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next after every message was settled: %v, %v; want nothing (context.DeadlineExceeded)", d, err)
	}
}
