package idempg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
)

// BenchmarkConsumerInbox measures a consumer whose inbox is an idempg.Inbox
// against the hand-written minimum, in one process, on the same kind of
// stream: b.N messages published on an in-memory transport (so that the
// transport costs next to nothing) and consumed one at a time, each
// incrementing a counter row in PostgreSQL in the transaction of its inbox
// row.
//
//   - consumer: consumer.New with the idempg Inbox, DeadLetters and Ledger,
//     InTx DB.WithTx and Concurrency 1; the handler increments the counter
//     through DB.WithTx, joining the inbox's transaction. The messages carry
//     ordering keys, as the payment service's events do, so the consumer
//     also looks, in that transaction, whether the key is held back.
//   - minimal: a loop that takes each delivery and runs one transaction of
//     INSERT INTO idem_inbox ... ON CONFLICT DO NOTHING and, when a row was
//     inserted, UPDATE counter SET n = n + 1, commits, then acknowledges.
//
// Each reports msgs/s, and minimal also the ratio of the consumer's rate
// (its latest run) to its own, as the metric consumer/minimal. Both check
// that the counter and the inbox end with b.N each.
//
//	go test -run '^$' -bench ConsumerInbox -benchtime 5000x ./idempg/
func BenchmarkConsumerInbox(b *testing.B) {
	var consumerRate float64
	b.Run("consumer", func(b *testing.B) { consumerRate = benchConsumer(b) })
	b.Run("minimal", func(b *testing.B) {
		rate := benchMinimal(b)
		if consumerRate > 0 {
			b.ReportMetric(consumerRate/rate, "consumer/minimal")
		}
	})
}

const benchTopic = "payments.succeeded"

// benchWorld is what both sub-benchmarks start from: a fresh schema with
// the message tables and a counter at 0, and b.N messages published.
type benchWorld struct {
	db *idempg.DB
	tr *idemmem.Transport
}

func newBenchWorld(b *testing.B) benchWorld {
	b.Helper()
	db := openDB(b, pgURL(b), idempg.Config{})
	err := db.Migrate(b.Context(), "bench_counter", fstest.MapFS{
		"0001_counter.sql": {Data: []byte(`CREATE TABLE counter (n bigint NOT NULL); INSERT INTO counter VALUES (0);`)},
	})
	if err != nil {
		b.Fatal(err)
	}
	tr := idemmem.NewTransport(nil)
	b.Cleanup(func() { _ = tr.Close() })
	msgs := make([]idem.Message, b.N)
	for i := range msgs {
		msgs[i] = idem.Message{
			ID:      fmt.Sprintf("evt-%d", i),
			Topic:   benchTopic,
			Key:     fmt.Sprintf("acct-%d", i%16),
			Payload: fmt.Appendf(nil, `{"event_id":"evt-%d","amount":1250}`, i),
		}
	}
	if err := tr.Publish(b.Context(), msgs...); err != nil {
		b.Fatal(err)
	}
	return benchWorld{db: db, tr: tr}
}

// check fails the benchmark unless every message was applied exactly once.
func (w benchWorld) check(b *testing.B) {
	b.Helper()
	var n, rows int64
	if err := w.db.Pool().QueryRow(b.Context(), `SELECT (SELECT n FROM counter), (SELECT count(*) FROM idem_inbox)`).
		Scan(&n, &rows); err != nil {
		b.Fatal(err)
	}
	if n != int64(b.N) || rows != int64(b.N) {
		b.Fatalf("counter = %d and %d inbox rows after %d messages, want %d of each", n, rows, b.N, b.N)
	}
}

// report reports the rate of b.N messages in d, and returns it.
func report(b *testing.B, d time.Duration) float64 {
	rate := float64(b.N) / d.Seconds()
	b.ReportMetric(rate, "msgs/s")
	return rate
}

func benchConsumer(b *testing.B) float64 {
	w := newBenchWorld(b)
	ctx := b.Context()
	inbox, err := idempg.NewInbox(ctx, w.db)
	if err != nil {
		b.Fatal(err)
	}
	dls, err := idempg.NewDeadLetters(ctx, w.db, nil)
	if err != nil {
		b.Fatal(err)
	}
	ledger, err := idempg.NewLedger(ctx, w.db)
	if err != nil {
		b.Fatal(err)
	}
	acks := &ackCounter{Subscriber: w.tr, want: int64(b.N), done: make(chan struct{})}
	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       benchTopic,
		Subscriber:  acks,
		Inbox:       inbox,
		DeadLetters: dls,
		Ledger:      ledger,
		InTx: func(ctx context.Context, fn func(context.Context) error) error {
			return w.db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
		},
		Concurrency: 1,
	})
	if err != nil {
		b.Fatal(err)
	}
	handler := func(ctx context.Context, m idem.Message) error {
		return w.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1`)
			return err
		})
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	b.ResetTimer()
	start := time.Now()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx, handler) }()
	select {
	case <-acks.done:
	case err := <-ran:
		b.Fatalf("Run returned %v before every message was acknowledged", err)
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d messages acknowledged after 5 minutes", acks.n.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	if err := <-ran; err != nil {
		b.Fatalf("Run: %v", err)
	}
	if st := c.Stats(); st.Processed != int64(b.N) {
		b.Fatalf("Stats = %+v, want %d processed", st, b.N)
	}
	w.check(b)
	return report(b, elapsed)
}

// ackCounter wraps a Subscriber and closes done once want deliveries were
// acknowledged: each after its transaction committed.
type ackCounter struct {
	idem.Subscriber
	want int64
	n    atomic.Int64
	done chan struct{}
}

func (a *ackCounter) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	s, err := a.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &ackStream{Stream: s, a: a}, nil
}

type ackStream struct {
	idem.Stream
	a *ackCounter
}

func (s *ackStream) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	return &ackDelivery{Delivery: d, a: s.a}, nil
}

type ackDelivery struct {
	idem.Delivery
	a *ackCounter
}

func (d *ackDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil && d.a.n.Add(1) == d.a.want {
		close(d.a.done)
	}
	return err
}

func benchMinimal(b *testing.B) float64 {
	w := newBenchWorld(b)
	ctx := b.Context()
	// The inbox table is idem_inbox itself, with its indexes: the minimum
	// does the same writes.
	if _, err := idempg.NewInbox(ctx, w.db); err != nil {
		b.Fatal(err)
	}
	stream, err := w.tr.Subscribe(ctx, idem.Subscription{Topic: benchTopic, Consumer: "settlement"})
	if err != nil {
		b.Fatal(err)
	}
	defer stream.Close()
	pool := w.db.Pool()

	b.ResetTimer()
	start := time.Now()
	for range b.N {
		d, err := stream.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO idem_inbox (consumer, dedup_key, processed_at)
				VALUES ($1, $2, clock_timestamp()) ON CONFLICT DO NOTHING`, "settlement", d.Message().ID)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE counter SET n = n + 1`)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Ack(ctx); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	w.check(b)
	return report(b, elapsed)
}
