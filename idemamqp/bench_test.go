package idemamqp_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
)

// The benchmarks measure messages per second through one quorum queue, on
// the broker of IDEM_AMQP_URL, against what a user of amqp091-go would
// write by hand for the same work. Each iteration is one message:
// -benchtime=20000x publishes, or takes and acknowledges, 20,000.
//
//	go test -run '^$' -bench . -benchtime 20000x ./idemamqp

// benchBatch is the size of a Publish call and of a NextBatch.
const benchBatch = 100

var benchPayload = bytes.Repeat([]byte("p"), 128)

func benchMessages(run string, from, n int) []idem.Message {
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{
			ID:      fmt.Sprintf("%s-%d", run, from+i),
			Topic:   "payments",
			Key:     fmt.Sprintf("acct-%d", (from+i)%97),
			Payload: benchPayload,
		}
	}
	return msgs
}

func reportRate(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// rawQueue declares, with amqp091-go alone, a topic exchange and a quorum
// queue bound to "payments", as the transport does, deleted when the
// benchmark ends.
func rawQueue(b *testing.B) (*amqp.Connection, string, string) {
	b.Helper()
	url := amqpURL(b)
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	run := fmt.Sprintf("%08x", rand.Uint32())
	exchange, queue := "idembench."+run, "idembench."+run+".c"
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		b.Fatal(err)
	}
	if err := ch.QueueBind(queue, "payments", exchange, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
			_ = ch.Close()
		}
		_ = conn.Close()
	})
	return conn, exchange, queue
}

// rawPublish publishes n messages the way a user would: confirm mode,
// PublishWithDeferredConfirm for a batch, then wait for its confirms.
func rawPublish(b *testing.B, ch *amqp.Channel, exchange, run string, n int) {
	b.Helper()
	confirms := make([]*amqp.DeferredConfirmation, 0, benchBatch)
	for i := 0; i < n; i += benchBatch {
		confirms = confirms[:0]
		for j := i; j < min(i+benchBatch, n); j++ {
			dc, err := ch.PublishWithDeferredConfirm(exchange, "payments", false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent,
				MessageId:    fmt.Sprintf("%s-%d", run, j),
				Headers:      amqp.Table{"Idem-Key": fmt.Sprintf("acct-%d", j%97)},
				Body:         benchPayload,
			})
			if err != nil {
				b.Fatal(err)
			}
			confirms = append(confirms, dc)
		}
		for _, dc := range confirms {
			if ok, err := dc.WaitContext(b.Context()); err != nil || !ok {
				b.Fatalf("confirm: %v, %v", ok, err)
			}
		}
	}
}

func BenchmarkPublish(b *testing.B) {
	b.Run("idem", func(b *testing.B) {
		tr := newIsolated(b, idemamqp.Config{})
		// The queue exists before publishing, as RabbitMQ routes only to
		// queues that exist.
		s, err := tr.Subscribe(b.Context(), idem.Subscription{Topic: "payments", Consumer: "c"})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		run := fmt.Sprintf("%08x", rand.Uint32())
		b.ResetTimer()
		for i := 0; i < b.N; i += benchBatch {
			if err := tr.Publish(b.Context(), benchMessages(run, i, min(benchBatch, b.N-i))...); err != nil {
				b.Fatal(err)
			}
		}
		reportRate(b)
	})
	b.Run("amqp091/confirms", func(b *testing.B) {
		conn, exchange, _ := rawQueue(b)
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		run := fmt.Sprintf("%08x", rand.Uint32())
		b.ResetTimer()
		rawPublish(b, ch, exchange, run, b.N)
		reportRate(b)
	})
}

func BenchmarkTakeAck(b *testing.B) {
	take := func(b *testing.B, prefetch int, batch bool) {
		tr := newIsolated(b, idemamqp.Config{MaxInFlight: prefetch})
		s, err := tr.Subscribe(b.Context(), idem.Subscription{Topic: "payments", Consumer: "c"})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run := fmt.Sprintf("%08x", rand.Uint32())
		for i := 0; i < b.N; i += 1000 {
			if err := tr.Publish(b.Context(), benchMessages(run, i, min(1000, b.N-i))...); err != nil {
				b.Fatal(err)
			}
		}
		bs := s.(idem.BatchStream)
		ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
		defer cancel()
		b.ResetTimer()
		for n := 0; n < b.N; {
			if batch {
				ds, err := bs.NextBatch(ctx, min(benchBatch, b.N-n))
				if err != nil {
					b.Fatal(err)
				}
				acked, err := bs.AckBatch(ctx, ds)
				if err != nil || acked != len(ds) {
					b.Fatalf("AckBatch = %d of %d, %v", acked, len(ds), err)
				}
				n += len(ds)
				continue
			}
			d, err := s.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Ack(ctx); err != nil {
				b.Fatal(err)
			}
			n++
		}
		reportRate(b)
	}
	b.Run("idem/NextBatch+AckBatch", func(b *testing.B) { take(b, 0, true) })
	b.Run("idem/NextBatch+AckBatch/prefetch=100", func(b *testing.B) { take(b, 100, true) })
	b.Run("idem/Next+Ack", func(b *testing.B) { take(b, 0, false) })

	// What a user writes: a consumer with the same prefetch, and an ack
	// for each delivery.
	b.Run("amqp091/Consume+Ack", func(b *testing.B) {
		conn, exchange, queue := rawQueue(b)
		pub, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		if err := pub.Confirm(false); err != nil {
			b.Fatal(err)
		}
		rawPublish(b, pub, exchange, fmt.Sprintf("%08x", rand.Uint32()), b.N)
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Qos(300, 0, false); err != nil {
			b.Fatal(err)
		}
		deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		timeout := time.After(time.Minute)
		b.ResetTimer()
		for n := 0; n < b.N; n++ {
			select {
			case d := <-deliveries:
				if err := d.Ack(false); err != nil {
					b.Fatal(err)
				}
			case <-timeout:
				b.Fatalf("%d of %d delivered", n, b.N)
			}
		}
		reportRate(b)
	})
}
