package idemnats_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemnats"
)

// The benchmarks measure messages per second through one stream, on the
// server of IDEM_NATS_URL, against what a user of nats.go's jetstream
// package would write by hand for the same work. Each iteration is one
// message: -benchtime=20000x publishes, or takes and acknowledges, 20,000.
//
//	go test -run '^$' -bench . -benchtime 20000x ./idemnats

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

// rawStream creates a stream, as the transport does, for the hand-written
// loops, and returns its context, connection, and subject prefix.
func rawStream(b *testing.B) (jetstream.JetStream, *nats.Conn, string, string) {
	b.Helper()
	nc, err := nats.Connect(natsURL(b))
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	run := fmt.Sprintf("%08x", rand.Uint32())
	name, prefix := "IDEMBENCH_"+run, "idembench"+run
	if _, err := js.CreateStream(b.Context(), jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
		nc.Close()
	})
	return js, nc, name, prefix
}

func BenchmarkPublish(b *testing.B) {
	for _, window := range []int{256, 1} {
		b.Run(fmt.Sprintf("idem/window=%d", window), func(b *testing.B) {
			tr := newIsolated(b, idemnats.Config{PublishWindow: window})
			run := fmt.Sprintf("%08x", rand.Uint32())
			b.ResetTimer()
			for i := 0; i < b.N; i += benchBatch {
				if err := tr.Publish(b.Context(), benchMessages(run, i, min(benchBatch, b.N-i))...); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b)
		})
	}
	// What a user writes: PublishMsgAsync for a batch, then wait for its
	// PubAcks.
	b.Run("nats.go/PublishMsgAsync", func(b *testing.B) {
		js, _, _, prefix := rawStream(b)
		run := fmt.Sprintf("%08x", rand.Uint32())
		futures := make([]jetstream.PubAckFuture, 0, benchBatch)
		b.ResetTimer()
		for i := 0; i < b.N; i += benchBatch {
			futures = futures[:0]
			for j := i; j < min(i+benchBatch, b.N); j++ {
				m := nats.NewMsg(prefix + ".payments")
				m.Header.Set("Idem-Key", fmt.Sprintf("acct-%d", j%97))
				m.Data = benchPayload
				f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(fmt.Sprintf("%s-%d", run, j)))
				if err != nil {
					b.Fatal(err)
				}
				futures = append(futures, f)
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				}
			}
		}
		reportRate(b)
	})
}

func BenchmarkTakeAck(b *testing.B) {
	take := func(b *testing.B, batch bool) {
		tr := newIsolated(b, idemnats.Config{})
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
	b.Run("idem/NextBatch+AckBatch", func(b *testing.B) { take(b, true) })
	b.Run("idem/Next+Ack", func(b *testing.B) { take(b, false) })

	// What a user writes: a durable pull consumer, Fetch a batch, Ack
	// each message, and flush once (Ack does not wait for the server);
	// or DoubleAck each, which waits, as AckBatch does, for the server to
	// record every acknowledgement, one round trip each.
	for _, double := range []bool{false, true} {
		name := "nats.go/Fetch+Ack+Flush"
		if double {
			name = "nats.go/Fetch+DoubleAck"
		}
		b.Run(name, func(b *testing.B) {
			js, nc, stream, prefix := rawStream(b)
			run := fmt.Sprintf("%08x", rand.Uint32())
			for i := 0; i < b.N; i++ {
				m := nats.NewMsg(prefix + ".payments")
				m.Data = benchPayload
				if _, err := js.PublishMsgAsync(m, jetstream.WithMsgID(fmt.Sprintf("%s-%d", run, i))); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("PubAcks did not come")
			}
			cons, err := js.CreateOrUpdateConsumer(b.Context(), stream, jetstream.ConsumerConfig{
				Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000,
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for n := 0; n < b.N; {
				batch, err := cons.Fetch(min(benchBatch, b.N-n), jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				for msg := range batch.Messages() {
					if double {
						err = msg.DoubleAck(b.Context())
					} else {
						err = msg.Ack()
					}
					if err != nil {
						b.Fatal(err)
					}
					n++
				}
				if err := batch.Error(); err != nil {
					b.Fatal(err)
				}
				if !double {
					if err := nc.Flush(); err != nil {
						b.Fatal(err)
					}
				}
			}
			reportRate(b)
		})
	}
}
