package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemtest"
)

func amqpURL(t testing.TB) string {
	t.Helper()
	return idemtest.RequireService(t, "RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
}

// newIsolated returns a Transport on an exchange and queue prefix of its
// own, deleted with its queues when the test ends.
func newIsolated(t testing.TB, cfg idemamqp.Config) *idemamqp.Transport {
	t.Helper()
	return newIsolatedAt(t, amqpURL(t), cfg)
}

// newIsolatedAt is newIsolated on the broker at url.
func newIsolatedAt(t testing.TB, url string, cfg idemamqp.Config) *idemamqp.Transport {
	t.Helper()
	run := fmt.Sprintf("%08x", rand.Uint32())
	cfg.Exchange = "idemtest." + run
	cfg.QueuePrefix = "idemtest." + run
	tr, err := idemamqp.Open(t.Context(), url, &cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tr.DeleteQueues(ctx); err != nil && !errors.Is(err, idem.ErrClosed) {
			t.Errorf("DeleteQueues: %v", err)
		}
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		deleteExchange(t, url, cfg.Exchange)
	})
	return tr
}

func deleteExchange(t testing.TB, url, name string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("dial to delete exchange %s: %v", name, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("channel: %v", err)
		return
	}
	defer ch.Close()
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		t.Errorf("delete exchange %s: %v", name, err)
	}
}

// deliveredOne subscribes consumer "c" to topic "t" of tr, publishes m1
// there and returns the stream, closed when the test ends, and m1's
// delivery.
func deliveredOne(t *testing.T, tr *idemamqp.Transport) (idem.Stream, idem.Delivery) {
	t.Helper()
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "t", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	return s, next(t, s)
}

func next(t *testing.T, s idem.Stream) idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return d
}

// The attempt count survives delayed copies, restarts and immediate
// requeues together, and the copy keeps the message's topic, key, time
// and headers.
func TestAttemptsAcrossDelays(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	sub := idem.Subscription{Topic: "orders.eu", Consumer: "c"}
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	want := idem.Message{
		ID: "m1", Topic: "orders.eu", Key: "k", Headers: map[string]string{"A": "b"},
		Payload: []byte("p"), Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
	if err := tr.Publish(t.Context(), want); err != nil {
		t.Fatal(err)
	}
	settle := []func(d idem.Delivery) error{
		func(d idem.Delivery) error { return d.Nack(t.Context(), 20*time.Millisecond) },
		func(d idem.Delivery) error { return d.Nack(t.Context(), 0) },
		func(d idem.Delivery) error { return s.Close() }, // unsettled, given back
		func(d idem.Delivery) error { return d.Nack(t.Context(), 30*time.Millisecond) },
		func(d idem.Delivery) error { return d.Ack(t.Context()) },
	}
	for i, fn := range settle {
		d := next(t, s)
		got := d.Message()
		if got.ID != want.ID || got.Topic != want.Topic || got.Key != want.Key || got.Headers["A"] != "b" ||
			len(got.Headers) != 1 || string(got.Payload) != "p" || !got.Time.Equal(want.Time) {
			t.Fatalf("delivery %d: message = %+v, want %+v", i+1, got, want)
		}
		if d.Attempt() != i+1 {
			t.Errorf("delivery %d: Attempt = %d", i+1, d.Attempt())
		}
		if err := fn(d); err != nil {
			t.Fatalf("delivery %d: settle: %v", i+1, err)
		}
		if i == 2 {
			if s, err = tr.Subscribe(t.Context(), sub); err != nil {
				t.Fatal(err)
			}
		}
	}
	_ = s.Close()
}

func TestUnroutable(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{Mandatory: true})
	err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "nobody.listens"})
	if !errors.Is(err, idemamqp.ErrUnroutable) {
		t.Fatalf("Publish with no queue bound = %v, want ErrUnroutable", err)
	}
	// The publishing channel still works afterwards.
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "nobody.listens", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := tr.Publish(t.Context(), idem.Message{ID: "m2", Topic: "nobody.listens"}); err != nil {
		t.Fatalf("Publish once bound: %v", err)
	}
	if d := next(t, s); d.Message().ID != "m2" {
		t.Errorf("got %q, want m2", d.Message().ID)
	}
}

func TestSettleTwice(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	_, d := deliveredOne(t, tr)
	if err := d.InProgress(t.Context()); err != nil {
		t.Errorf("InProgress: %v", err)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"Ack":        d.Ack(t.Context()),
		"Nack":       d.Nack(t.Context(), time.Second),
		"Term":       d.Term(t.Context()),
		"InProgress": d.InProgress(t.Context()),
	} {
		if !errors.Is(err, idemamqp.ErrStaleDelivery) {
			t.Errorf("%s after Ack = %v, want ErrStaleDelivery", what, err)
		}
	}
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	for name, m := range map[string]idem.Message{
		"broker header":    {ID: "a", Topic: "t", Headers: map[string]string{"x-death": "x"}},
		"reserved header":  {ID: "a", Topic: "t", Headers: map[string]string{"idem-key": "x"}},
		"long header name": {ID: "a", Topic: "t", Headers: map[string]string{strings.Repeat("h", 256): "x"}},
		"long topic":       {ID: "a", Topic: strings.Repeat("t", 256)},
		"long ID":          {ID: strings.Repeat("i", 256), Topic: "t"},
	} {
		if err := tr.Publish(t.Context(), m); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Publish(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
	for name, sub := range map[string]idem.Subscription{
		"long consumer":        {Topic: "t", Consumer: strings.Repeat("c", 240)},
		"negative AckWait":     {Topic: "t", Consumer: "c", AckWait: -time.Second},
		"negative MaxInFlight": {Topic: "t", Consumer: "c", MaxInFlight: -1},
	} {
		if _, err := tr.Subscribe(t.Context(), sub); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Subscribe(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestClosed(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := tr.Publish(t.Context(), idem.Message{ID: "m", Topic: "t"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	if _, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "t", Consumer: "c"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want ErrClosed", err)
	}
}

func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idemamqp.Config{
		"amq exchange":      {Exchange: "amq.topic"},
		"negative limit":    {DeliveryLimit: -1},
		"negative inflight": {MaxInFlight: -1},
		"negative window":   {PublishWindow: -1},
	} {
		if _, err := idemamqp.Open(t.Context(), "amqp://127.0.0.1:1/", &cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Open(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestExample runs Example, which needs the broker, and checks its output.
func TestExample(t *testing.T) {
	// Not parallel: it swaps os.Stdout.
	url := amqpURL(t)
	defer deleteExchange(t, url, exampleName)
	want := "evt-1 acct-1 attempt 1\nevt-1 payments.succeeded attempt 2\n"
	if got := captureStdout(t, Example); got != want {
		t.Errorf("Example printed:\n%s\nwant:\n%s", got, want)
	}
}

func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		fn()
	}()
	w.Close()
	out := <-done
	r.Close()
	return string(out)
}

// TestDelayedNackWhoseCopyFails: when the delayed copy cannot be made
// (here its delay queue exists with other arguments, so declaring it
// fails), the original goes back to the queue at once rather than stay
// held by a channel that lives on, which RabbitMQ would deliver again
// only once the channel closed.
func TestDelayedNackWhoseCopyFails(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	// 100ms is a delay bucket of its own (five significant bits).
	delayQueue := tr.Queue("c") + ".delay.100"
	conn, err := amqp.Dial(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(delayQueue, false, true, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := ch.QueueDelete(delayQueue, false, false, false); err != nil {
			t.Errorf("deleting %s: %v", delayQueue, err)
		}
	}()

	s, d := deliveredOne(t, tr)
	if err := d.Nack(t.Context(), 100*time.Millisecond); err != nil {
		t.Errorf("Nack whose copy failed = %v, want nil: the original requeued", err)
	}
	again := next(t, s)
	if again.Message().ID != "m1" || again.Attempt() != 2 {
		t.Errorf("delivered again: %q, attempt %d; want m1, attempt 2", again.Message().ID, again.Attempt())
	}
	if err := again.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
}
