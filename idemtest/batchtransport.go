package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// longAckWait is the AckWait of the subscriptions of testNextInterrupted: so
// long that only a give-back, never an AckWait, can bring a message back
// within the test.
const longAckWait = 10 * time.Minute

// testNextInterrupted cancels Next (and NextBatch, where there is one) a
// moment after it starts, again and again, each time on a new stream that
// it then closes: whatever a cancelled call took, it must have given back,
// so the message is handed out again at once, with an attempt count that
// counts only the deliveries that were received.
func testNextInterrupted(t *testing.T, e *transportEnv) {
	topic, c := e.topic("orders"), e.consumer("c")
	sub := idem.Subscription{Topic: topic, Consumer: c, AckWait: longAckWait}
	open := func() idem.Stream {
		t.Helper()
		s, err := e.sub.Subscribe(e.ctx, sub)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		return s
	}
	first := open()
	m := e.msg(topic, 1)
	e.publish(m)
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	received := 0
	for i := range 30 {
		s := open()
		wait := time.Duration(r.IntN(1500)) * time.Microsecond
		ctx, cancel := context.WithTimeout(e.ctx, wait)
		var ds []idem.Delivery
		var err error
		if bs, ok := s.(idem.BatchStream); ok && i%2 == 1 {
			ds, err = bs.NextBatch(ctx, 10)
		} else {
			var d idem.Delivery
			if d, err = s.Next(ctx); err == nil {
				ds = []idem.Delivery{d}
			}
		}
		cancel()
		switch {
		case err == nil:
			// Received: handed back as a consumer would, so that only
			// what nobody received could hold the message.
			for _, d := range ds {
				received++
				if nerr := d.Nack(e.ctx, 0); nerr != nil {
					t.Fatalf("Nack: %v", nerr)
				}
			}
		case !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("Next cancelled after %v = %v, want the context's error", wait, err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	s := open()
	defer s.Close()
	ctx, cancel := context.WithTimeout(e.ctx, max(2*time.Second, 4*e.quiet))
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next after 30 interrupted ones (%d received) = %v: a cancelled Next kept the message", received, err)
	}
	if d.Message().ID != m.ID {
		t.Fatalf("Next = %q, want %q", d.Message().ID, m.ID)
	}
	if e.f.AttemptCount && !e.f.CountsPrefetched && d.Attempt() != received+1 {
		t.Errorf("Attempt = %d after %d received deliveries, want %d: an interrupted Next counted an attempt nobody received",
			d.Attempt(), received, received+1)
	}
	e.ack(d)
}

// batchStream subscribes and returns the stream as an idem.BatchStream, or
// skips the test when it is not one.
func (e *transportEnv) batchStream(topic, consumer string) idem.BatchStream {
	e.t.Helper()
	s := e.subscribe(topic, consumer)
	bs, ok := s.(idem.BatchStream)
	if !ok {
		e.t.Skip("the transport's streams are not idem.BatchStream")
	}
	return bs
}

// nextBatch returns the stream's next batch, waiting up to waitLimit, and
// checks its size.
func (e *transportEnv) nextBatch(s idem.BatchStream, limit int, what string) []idem.Delivery {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	ds, err := s.NextBatch(ctx, limit)
	if err != nil {
		e.t.Fatalf("NextBatch(%d), waiting for %s: %v", limit, what, err)
	}
	if len(ds) == 0 || len(ds) > limit {
		e.t.Fatalf("NextBatch(%d) returned %d deliveries, want 1 to %d", limit, len(ds), limit)
	}
	return ds
}

func testBatchTakeAndAck(t *testing.T, e *transportEnv) {
	const n, limit = 25, 10
	topic := e.topic("orders")
	s := e.batchStream(topic, e.consumer("c"))
	var msgs []idem.Message
	for i := range n {
		msgs = append(msgs, e.msg(topic, i))
	}
	e.publish(msgs...)
	var order []string
	var all []idem.Delivery
	seen := make(map[string]bool)
	for deliveries := 0; len(order) < n; {
		e.bound(deliveries, n, len(order))
		ds := e.nextBatch(s, limit, fmt.Sprintf("messages from %d of %d", len(order)+1, n))
		deliveries += len(ds)
		for _, d := range ds {
			if id := d.Message().ID; !seen[id] {
				seen[id] = true
				order = append(order, id)
			}
			if d.Attempt() < 1 {
				t.Errorf("message %q: Attempt = %d, want at least 1", d.Message().ID, d.Attempt())
			}
		}
		all = append(all, ds...)
	}
	if e.f.OrderedPerTopic {
		for i, id := range order {
			if id != msgs[i].ID {
				t.Fatalf("message %d is %q, want %q: batches come in publish order", i, id, msgs[i].ID)
			}
		}
	}
	acked, err := s.AckBatch(e.ctx, all)
	if err != nil {
		t.Fatalf("AckBatch of %d deliveries: %v", len(all), err)
	}
	if acked < n || acked > len(all) {
		t.Errorf("AckBatch acknowledged %d of %d deliveries of %d messages", acked, len(all), n)
	}
	e.none(s, "every message was acknowledged in one batch")
	if e.f.AckWait {
		e.noneThroughAckWait(s, "acknowledged messages stay acknowledged")
	}
	again, err := s.AckBatch(e.ctx, all)
	if err != nil {
		t.Fatalf("AckBatch of deliveries acknowledged already = %v, want them passed over", err)
	}
	if again != 0 {
		t.Errorf("AckBatch of deliveries acknowledged already acknowledged %d, want 0", again)
	}
}

func testBatchAckPassesOverStale(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.batchStream(topic, e.consumer("c"))
	m1, m2 := e.msg(topic, 1), e.msg(topic, 2)
	e.publish(m1, m2)
	first := e.nextID(s, m1.ID, 1)
	// Handed back and out again: first no longer stands for m1.
	if err := first.Nack(e.ctx, 0); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	var current []idem.Delivery
	for got := map[string]bool{}; len(got) < 2; {
		for _, d := range e.nextBatch(s, 10, "m1 again and m2") {
			got[d.Message().ID] = true
			current = append(current, d)
		}
	}
	acked, err := s.AckBatch(e.ctx, append([]idem.Delivery{first}, current...))
	if err != nil {
		t.Fatalf("AckBatch with a stale delivery = %v, want it passed over", err)
	}
	if acked != len(current) {
		t.Errorf("AckBatch acknowledged %d, want %d: the stale delivery must be passed over", acked, len(current))
	}
	e.none(s, "both messages were acknowledged")
}

func testBatchStreamInvalid(t *testing.T, e *transportEnv) {
	s := e.batchStream(e.topic("orders"), e.consumer("c"))
	for _, limit := range []int{0, -1} {
		if ds, err := s.NextBatch(e.ctx, limit); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("NextBatch(%d) = %d deliveries, %v; want idem.ErrInvalidArgument", limit, len(ds), err)
		}
	}
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	if ds, err := s.NextBatch(cancelled, 5); !errors.Is(err, context.Canceled) {
		t.Errorf("NextBatch(cancelled context) = %d deliveries, %v; want context.Canceled", len(ds), err)
	}
	if n, err := s.AckBatch(e.ctx, nil); n != 0 || err != nil {
		t.Errorf("AckBatch(nil) = %d, %v; want 0, nil", n, err)
	}
}
