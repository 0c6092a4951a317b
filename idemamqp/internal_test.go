package idemamqp

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
