package idemamqp_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemtest"
)

// A message sent back past the queue's delivery limit is not dropped:
// RabbitMQ dead-letters it to "<queue>.limit", the subscription delivers it
// from there with its attempts counted as the limit's, and the broker keeps
// it until it is settled.
func TestDeliveryLimitKeepsMessage(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{DeliveryLimit: 2})
	sub := idem.Subscription{Topic: "orders.eu", Consumer: "c"}
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	want := idem.Message{ID: "m1", Topic: "orders.eu", Key: "k", Headers: map[string]string{"A": "b"}, Payload: []byte("p")}
	if err := tr.Publish(t.Context(), want); err != nil {
		t.Fatal(err)
	}
	check := func(d idem.Delivery, attempt int) {
		t.Helper()
		got := d.Message()
		if got.ID != want.ID || got.Topic != want.Topic || got.Key != want.Key || len(got.Headers) != 1 ||
			got.Headers["A"] != "b" || string(got.Payload) != "p" {
			t.Fatalf("attempt %d: message = %+v, want %+v", attempt, got, want)
		}
		if d.Attempt() != attempt {
			t.Errorf("Attempt = %d, want %d", d.Attempt(), attempt)
		}
	}
	// The limit allows three deliveries: the first and two returns.
	for attempt := 1; attempt <= 3; attempt++ {
		d := next(t, s)
		check(d, attempt)
		if err := d.Nack(t.Context(), 0); err != nil {
			t.Fatalf("Nack: %v", err)
		}
	}
	// Past it, from <queue>.limit, counted as exhausted: the three
	// deliveries the limit allowed, and this one.
	check(next(t, s), 4)
	// Kept until settled: a stream that closes gives it back.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := next(t, s)
	check(d, 5)
	if err := d.Ack(t.Context()); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	for _, q := range []string{tr.Queue("c"), tr.Queue("c") + ".limit"} {
		if n := queueDepth(t, q); n != 0 {
			t.Errorf("queue %s holds %d messages after the Ack, want 0", q, n)
		}
	}
}

// A queue an earlier version declared, without a dead-letter target, keeps
// working: arguments cannot change on an existing queue, so the transport
// declares it as it is and reports, once, that it has no dead-letter
// target and the policy that gives it one.
func TestQueueWithoutDeadLetterTarget(t *testing.T) {
	t.Parallel()
	var logged syncBuffer
	tr := newIsolated(t, idemamqp.Config{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	queue := tr.Queue("c")
	declareRaw(t, queue, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	sub := idem.Subscription{Topic: "orders", Consumer: "c"}
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatalf("Subscribe on a queue without a dead-letter target: %v", err)
	}
	defer s.Close()
	if err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	d := next(t, s)
	if d.Message().ID != "m1" {
		t.Fatalf("got %q, want m1", d.Message().ID)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Subscribing again finds the same queue: still one warning.
	s2, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ws := tr.Warnings()
	if len(ws) != 1 {
		t.Fatalf("Warnings = %v, want one", ws)
	}
	w := ws[0]
	policy := `rabbitmqctl set_policy '` + queue + `.limit' '^` + regexp.QuoteMeta(queue) + `$' ` +
		`'{"dead-letter-exchange":"","dead-letter-routing-key":"` + queue + `.limit","dead-letter-strategy":"at-least-once","overflow":"reject-publish"}' --apply-to queues`
	if !errors.Is(w, idemamqp.ErrNoDeadLetterTarget) || w.Queue != queue || w.Fix != policy {
		t.Errorf("Warning = %+v, want ErrNoDeadLetterTarget on %s, fixed by %s", w, queue, policy)
	}
	if !strings.Contains(w.Error(), queue) || !strings.Contains(w.Error(), policy) {
		t.Errorf("Warning says %q: want the queue and the fix", w.Error())
	}
	if got := logged.String(); strings.Count(got, "level=WARN") != 1 || !strings.Contains(got, "dead-letter-routing-key") {
		t.Errorf("logged %q, want one warning with the fix", got)
	}
}

// A queue an earlier version declared with other arguments than the
// Transport's configuration (its type, its delivery limit) is still
// refused, as it was: only the missing dead-letter target is let pass.
func TestQueueWithOtherArgumentsRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  idemamqp.Config
		args amqp.Table
	}{
		"classic, configured quorum": {idemamqp.Config{}, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}},
		"another delivery limit":     {idemamqp.Config{DeliveryLimit: 3}, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(5)}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr := newIsolated(t, tc.cfg)
			declareRaw(t, tr.Queue("c"), tc.args)
			s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
			var ae *amqp.Error
			if err == nil {
				s.Close()
				t.Fatal("Subscribe succeeded; want the broker's refusal")
			}
			if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
				t.Errorf("Subscribe = %v, want PRECONDITION_FAILED", err)
			}
			if ws := tr.Warnings(); len(ws) != 0 {
				t.Errorf("Warnings = %v, want none", ws)
			}
		})
	}
}

// A stream consumes its queue and its limit queue on one channel: when the
// broker cancels one of them (the queue was deleted), the stream
// subscribes anew, declaring both again, as it does when its channel dies.
func TestQueueDeletedUnderStream(t *testing.T) {
	t.Parallel()
	// Mandatory, so that a message published before the queue is bound
	// again is refused rather than dropped.
	tr := newIsolated(t, idemamqp.Config{Mandatory: true})
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deleteQueue(t, tr.Queue("c"))
	type result struct {
		d   idem.Delivery
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		d, err := s.Next(ctx)
		got <- result{d, err}
	}()
	var perr error
	idemtest.Eventually(t, 10*time.Second, "the stream to declare and bind its queue again", func() bool {
		perr = tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "orders"})
		return !errors.Is(perr, idemamqp.ErrUnroutable)
	})
	if perr != nil {
		t.Fatal(perr)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("Next after the queue was deleted: %v", r.err)
	}
	if r.d.Message().ID != "m1" {
		t.Errorf("got %q, want m1", r.d.Message().ID)
	}
	if err := r.d.Ack(t.Context()); err != nil {
		t.Errorf("Ack: %v", err)
	}
}

// rawChannel opens a channel of its own to the broker, closed with the
// test.
func rawChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// queueDepth returns the number of messages ready in queue.
func queueDepth(t *testing.T, queue string) int {
	t.Helper()
	q, err := rawChannel(t).QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", queue, err)
	}
	return q.Messages
}

func deleteQueue(t *testing.T, queue string) {
	t.Helper()
	if _, err := rawChannel(t).QueueDelete(queue, false, false, false); err != nil {
		t.Fatalf("delete %s: %v", queue, err)
	}
}

// declareRaw declares queue with args as another client would, and
// deletes it when the test ends.
func declareRaw(t *testing.T, queue string, args amqp.Table) {
	t.Helper()
	if _, err := rawChannel(t).QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", queue, err)
	}
	url := amqpURL(t)
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Errorf("dial to delete %s: %v", queue, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("channel: %v", err)
			return
		}
		defer ch.Close()
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("delete %s: %v", queue, err)
		}
	})
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
