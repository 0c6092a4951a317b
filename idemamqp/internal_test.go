package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

func TestDelayBucket(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want time.Duration
	}{
		{0, time.Millisecond},
		{time.Microsecond, time.Millisecond},
		{31 * time.Millisecond, 31 * time.Millisecond},
		{32 * time.Millisecond, 32 * time.Millisecond},
		{33 * time.Millisecond, 34 * time.Millisecond},
		{1000 * time.Millisecond, 1024 * time.Millisecond},
		{1024 * time.Millisecond, 1024 * time.Millisecond},
		{1025 * time.Millisecond, 1088 * time.Millisecond},
		{time.Hour, 3_670_016 * time.Millisecond},
	} {
		got := delayBucket(tc.in)
		if got != tc.want {
			t.Errorf("delayBucket(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if got < tc.in || (tc.in > 32*time.Millisecond && got > tc.in+tc.in/16) {
			t.Errorf("delayBucket(%v) = %v: outside [d, d+d/16]", tc.in, got)
		}
	}
}

func TestAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		classic bool
		d       amqp.Delivery
		want    int
	}{
		{"first", false, amqp.Delivery{}, 1},
		{"quorum count", false, amqp.Delivery{Headers: amqp.Table{"x-delivery-count": int64(2)}, Redelivered: true}, 3},
		{"delayed copy", false, amqp.Delivery{Headers: amqp.Table{HeaderAttempts: "4"}}, 5},
		{"copy redelivered", false, amqp.Delivery{Headers: amqp.Table{HeaderAttempts: "4", "x-delivery-count": int32(1)}}, 6},
		{"classic redelivered", true, amqp.Delivery{Redelivered: true}, 2},
		{"quorum redelivered flag alone", false, amqp.Delivery{Redelivered: true}, 1},
	} {
		s := &stream{t: &Transport{cfg: Config{ClassicQueues: tc.classic}}}
		if got := s.delivery(tc.d).Attempt(); got != tc.want {
			t.Errorf("%s: Attempt = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestReserved(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"x-death": true, "x-delivery-count": true, "Idem-Key": true, "idem-time": true,
		"Idem-Topic": true, "Idem-Attempts": true, "X-Empty": false, "Idem-Fault": false, "Content-Type": false,
	} {
		if got := reserved(name); got != want {
			t.Errorf("reserved(%q) = %v, want %v", name, got, want)
		}
	}
}

// Only the broker's own failures are set up again; a refusal of the
// subscription itself (a queue declared with other arguments) is returned.
func TestBrokerHiccup(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("bind queue q: %w", &amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR"}), true},
		{fmt.Errorf("consume: %w", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED"}), true},
		{fmt.Errorf("open a channel: %w", amqp.ErrClosed), true},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type'"}, false},
		{&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}, false},
		{errors.New("dial: connection refused"), false},
	}
	for _, c := range cases {
		if got := brokerHiccup(c.err); got != c.want {
			t.Errorf("brokerHiccup(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// An ack with multiple set settles every unsettled delivery of the
// channel up to its tag: it may only cover tags being acknowledged.
func TestMultipleUpTo(t *testing.T) {
	t.Parallel()
	set := func(tags ...uint64) map[uint64]struct{} {
		m := make(map[uint64]struct{})
		for _, tag := range tags {
			m[tag] = struct{}{}
		}
		return m
	}
	mine := func(tags ...uint64) map[uint64]bool {
		m := make(map[uint64]bool)
		for _, tag := range tags {
			m[tag] = true
		}
		return m
	}
	for _, tc := range []struct {
		name      string
		unsettled map[uint64]struct{}
		mine      map[uint64]bool
		want      uint64
	}{
		{"all of them", set(1, 2, 3), mine(1, 2, 3), 3},
		{"a run from the lowest", set(4, 5, 6, 7, 9), mine(4, 5, 6), 6},
		{"an earlier one is held", set(1, 2, 3, 4), mine(2, 3, 4), 0},
		{"a gap", set(1, 2, 3, 4, 5), mine(1, 2, 4, 5), 2},
		{"settled ones in between", set(3, 7, 8), mine(3, 7, 8), 8},
		{"one alone", set(1, 2), mine(1), 0},
		{"waiting in the client", set(1, 2, 3, 4), mine(1, 2), 2},
		{"none", set(1), mine(), 0},
	} {
		var received uint64 = 1
		for tag := range tc.unsettled {
			received = max(received, tag+1)
		}
		if got := multipleUpTo(tc.unsettled, tc.mine, received); got != tc.want {
			t.Errorf("%s: multipleUpTo = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The channel numbers the deliveries of its two consumers (the queue's and
// its limit queue's) in one sequence, and one consumer's can arrive before
// a lower tag of the other's: an ack with multiple set must not reach a
// tag not received yet, which nobody has seen.
func TestMultipleUpToStopsAtUnreceived(t *testing.T) {
	t.Parallel()
	unsettled := map[uint64]struct{}{4: {}, 6: {}, 7: {}}
	mine := map[uint64]bool{4: true, 6: true, 7: true}
	if got := multipleUpTo(unsettled, mine, 5); got != 0 {
		t.Errorf("multipleUpTo with tag 5 not received = %d, want 0", got)
	}
	if got := multipleUpTo(unsettled, mine, 8); got != 7 {
		t.Errorf("multipleUpTo with every tag received = %d, want 7", got)
	}
	g := &channelGen{unsettled: make(map[uint64]struct{}), received: 1, ahead: make(map[uint64]struct{})}
	for _, tag := range []uint64{1, 3, 4, 2, 6} {
		g.record(tag)
	}
	if g.received != 5 {
		t.Errorf("after recording 1, 3, 4, 2, 6: received = %d, want 5", g.received)
	}
}

// The deliveries of a channel that died no longer stand for their
// messages, which the broker put back: AckBatch passes over them, and the
// stream subscribes anew and delivers the messages again.
func TestAckBatchOnDeadChannel(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	run := fmt.Sprintf("%08x", rand.Uint32())
	tr, err := Open(t.Context(), url, &Config{Exchange: "idemtest." + run, QueuePrefix: "idemtest." + run})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tr.DeleteQueues(ctx); err != nil {
			t.Errorf("DeleteQueues: %v", err)
		}
		ch, err := tr.channel(ctx)
		if err == nil {
			_ = ch.ExchangeDelete("idemtest."+run, false, false)
			_ = ch.Close()
		}
		_ = tr.Close()
	})
	is, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	s := is.(*stream)
	defer s.Close()
	if err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "orders"}, idem.Message{ID: "m2", Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var ds []idem.Delivery
	for len(ds) < 2 {
		more, err := s.NextBatch(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, more...)
	}
	// Acknowledging a tag the channel never delivered is a channel error:
	// the broker closes it.
	gen := ds[0].(*delivery).gen
	if err := gen.ch.Ack(1<<40, false); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 10*time.Second, "the channel to close", gen.ch.IsClosed)
	if n, err := s.AckBatch(ctx, ds); n != 0 || err != nil {
		t.Errorf("AckBatch of a dead channel's deliveries = %d, %v; want 0, nil", n, err)
	}
	again := map[string]int{}
	for len(again) < 2 {
		more, err := s.NextBatch(ctx, 2)
		if err != nil {
			t.Fatalf("NextBatch after the channel died: %v", err)
		}
		for _, d := range more {
			again[d.Message().ID] = d.Attempt()
		}
		if n, err := s.AckBatch(ctx, more); err != nil || n != len(more) {
			t.Fatalf("AckBatch = %d, %v; want %d", n, err, len(more))
		}
	}
	if again["m1"] != 2 || again["m2"] != 2 {
		t.Errorf("attempts after the channel died = %v, want 2 each", again)
	}
}

// A message the queue gave up past its delivery limit reaches the consumer
// from "<queue>.limit" counted as exhausted: every delivery the limit
// allowed (the configured one, or RabbitMQ 4's default), then those from
// the limit queue. Its topic comes from the x-death record of the queue.
func TestAttemptPastLimit(t *testing.T) {
	t.Parallel()
	death := func(queue, reason string, count int64) amqp.Table {
		return amqp.Table{"count": count, "exchange": "", "queue": queue, "reason": reason,
			"routing-keys": []any{"orders.eu"}}
	}
	for _, tc := range []struct {
		name      string
		limit     int
		headers   amqp.Table
		want      int
		wantTopic string
	}{
		{"given up at the configured limit", 2, amqp.Table{"x-death": []any{death("idem.c", "delivery_limit", 1)}}, 4, "orders.eu"},
		{"given up, then returned once", 2, amqp.Table{"x-death": []any{death("idem.c", "delivery_limit", 1)}, "x-delivery-count": int64(1)}, 5, "orders.eu"},
		{"given up at the default limit", 0, amqp.Table{"x-death": []any{death("idem.c", "delivery_limit", 1)}}, 22, "orders.eu"},
		{"a delayed copy given up", 2, amqp.Table{HeaderAttempts: "6", HeaderTopic: "orders.us", "x-death": []any{death("idem.c", "delivery_limit", 1)}}, 10, "orders.us"},
		{"expired in the queue", 2, amqp.Table{"x-death": []any{death("idem.c", "expired", 1)}}, 1, "orders.eu"},
	} {
		tr := &Transport{cfg: Config{DeliveryLimit: tc.limit}}
		s := &stream{t: tr, queue: "idem.c"}
		d := s.delivery(amqp.Delivery{RoutingKey: "idem.c.limit", Headers: tc.headers})
		if got := d.Attempt(); got != tc.want {
			t.Errorf("%s: Attempt = %d, want %d", tc.name, got, tc.want)
		}
		if got := d.Message().Topic; got != tc.wantTopic {
			t.Errorf("%s: Topic = %q, want %q", tc.name, got, tc.wantTopic)
		}
	}
}
