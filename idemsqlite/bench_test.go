package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// benchDB opens a fresh database file for one benchmark.
func benchDB(b *testing.B) *idemsqlite.DB {
	b.Helper()
	db, err := idemsqlite.Open(filepath.Join(b.TempDir(), "bench.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func benchTransport(b *testing.B, db *idemsqlite.DB) *idemsqlite.Transport {
	b.Helper()
	tr, err := idemsqlite.NewTransport(b.Context(), db, &idemsqlite.TransportConfig{Poll: 5 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Close() })
	return tr
}

// benchPublish publishes n messages to topic, in batches of 500.
func benchPublish(b *testing.B, tr *idemsqlite.Transport, topic string, n int) {
	b.Helper()
	const batch = 500
	for i := 0; i < n; i += batch {
		var msgs []idem.Message
		for j := i; j < min(i+batch, n); j++ {
			msgs = append(msgs, idem.Message{
				ID: fmt.Sprint("m-", j), Topic: topic, Key: fmt.Sprintf("acct-%d", j%16),
				Payload: fmt.Appendf(nil, `{"event_id":"m-%d","amount":1250}`, j),
			})
		}
		if err := tr.Publish(b.Context(), msgs...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTransportPublish measures Publish of one message on its own (a
// write transaction and a synced commit each), from 4×GOMAXPROCS
// goroutines, to a topic with one consumer name:
//
//	go test -run '^$' -bench TransportPublish -benchtime 5000x ./idemsqlite/
func BenchmarkTransportPublish(b *testing.B) {
	ctx := b.Context()
	tr := benchTransport(b, benchDB(b))
	s, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "settlement"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var n atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if err := tr.Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments", Payload: []byte(`{"amount":1250}`)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTransportTakeAck measures how fast 4 competing streams of one
// consumer name take and acknowledge b.N messages published beforehand,
// and reports msgs/s: "one" with Next and Ack, one message per write
// transaction each; "batch" with NextBatch(100) and AckBatch (skipped when
// the streams are not idem.BatchStream):
//
//	go test -run '^$' -bench TransportTakeAck -benchtime 20000x ./idemsqlite/
func BenchmarkTransportTakeAck(b *testing.B) {
	for _, tc := range []struct {
		name  string
		batch int
	}{{"one", 0}, {"batch", 100}} {
		b.Run(tc.name, func(b *testing.B) { benchTakeAck(b, tc.batch) })
	}
}

func benchTakeAck(b *testing.B, batch int) {
	ctx := b.Context()
	tr := benchTransport(b, benchDB(b))
	sub := idem.Subscription{Topic: "payments", Consumer: "settlement", AckWait: time.Minute}
	const streams = 4
	var ss []idem.Stream
	for range streams {
		s, err := tr.Subscribe(ctx, sub)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if _, ok := s.(idem.BatchStream); batch > 0 && !ok {
			b.Skip("the streams are not idem.BatchStream")
		}
		ss = append(ss, s)
	}
	benchPublish(b, tr, "payments", b.N)
	var left atomic.Int64
	left.Store(int64(b.N))
	// Ended with the last acknowledgement, so that no stream waits on.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() {
			for left.Load() > 0 {
				nctx, cancel := context.WithTimeout(runCtx, 100*time.Millisecond)
				var ds []idem.Delivery
				var err error
				if batch > 0 {
					ds, err = s.(idem.BatchStream).NextBatch(nctx, batch)
				} else {
					var d idem.Delivery
					if d, err = s.Next(nctx); err == nil {
						ds = []idem.Delivery{d}
					}
				}
				cancel()
				if err != nil {
					continue
				}
				if batch > 0 {
					n, err := s.(idem.BatchStream).AckBatch(ctx, ds)
					if err != nil || n != len(ds) {
						b.Errorf("AckBatch = %d of %d, %v", n, len(ds), err)
						return
					}
				} else if err := ds[0].Ack(ctx); err != nil {
					b.Error(err)
					return
				}
				if left.Add(-int64(len(ds))) <= 0 {
					stop()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkStore measures the Store on its own, one goroutine: "first" a
// Claim and a Complete of a new key (two write transactions, the claim's
// unsynced), "replay" a Claim that finds the completed record (the read
// pool only), "completetx" a Claim and a CompleteTx whose work writes one
// row:
//
//	go test -run '^$' -bench 'Store$' ./idemsqlite/
func BenchmarkStore(b *testing.B) {
	req := func(key string) idem.ClaimRequest {
		return idem.ClaimRequest{Scope: "POST /v1/payments", Key: idem.Key(key), Fingerprint: "v1:abc", Lease: time.Minute, TTL: time.Hour}
	}
	ref := func(c idem.Claim) idem.Ref {
		return idem.Ref{Scope: c.Record.Scope, Key: c.Record.Key, Token: c.Token}
	}
	resp := idem.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}
	newStore := func(b *testing.B) (*idemsqlite.DB, *idemsqlite.Store) {
		db := benchDB(b)
		s, err := idemsqlite.NewStore(b.Context(), db, nil)
		if err != nil {
			b.Fatal(err)
		}
		return db, s
	}
	b.Run("first", func(b *testing.B) {
		ctx := b.Context()
		_, s := newStore(b)
		i := 0
		for b.Loop() {
			i++
			c, err := s.Claim(ctx, req(fmt.Sprint("k-", i)))
			if err != nil || c.Outcome != idem.Acquired {
				b.Fatalf("Claim = %+v, %v", c, err)
			}
			if err := s.Complete(ctx, ref(c), resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		ctx := b.Context()
		_, s := newStore(b)
		c, err := s.Claim(ctx, req("k"))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, ref(c), resp); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if c, err := s.Claim(ctx, req("k")); err != nil || c.Outcome != idem.Completed {
				b.Fatalf("Claim = %+v, %v", c, err)
			}
		}
	})
	b.Run("completetx", func(b *testing.B) {
		ctx := b.Context()
		db, s := newStore(b)
		if err := db.Migrate(ctx, "bench_payments", fstest.MapFS{
			"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL);`)},
		}); err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			i++
			key := fmt.Sprint("k-", i)
			c, err := s.Claim(ctx, req(key))
			if err != nil || c.Outcome != idem.Acquired {
				b.Fatalf("Claim = %+v, %v", c, err)
			}
			kept, err := s.CompleteTx(ctx, ref(c), func(ctx context.Context) (idem.Response, bool, error) {
				err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES (?, ?)`, key, 1250)
					return err
				})
				return resp, err == nil, err
			})
			if err != nil || !kept {
				b.Fatalf("CompleteTx = %v, %v", kept, err)
			}
		}
	})
}

// BenchmarkConsumerInbox measures a consumer whose inbox, dead letters and
// ledger are idemsqlite's, against the hand-written minimum, each applying
// b.N messages (with ordering keys, as the payment service's events have)
// by incrementing a counter row in the transaction of its inbox row:
//
//   - consumer: consumer.New on an in-memory transport (so that the
//     transport costs next to nothing), Concurrency 1, InTx DB.WithTx; the
//     handler increments the counter through DB.WithTx, joining the inbox's
//     transaction;
//   - pipeline: the same consumer on the idemsqlite Transport of the same
//     file, so that acknowledgements can join the inbox's transaction;
//   - minimal: a loop that takes each delivery from the in-memory transport
//     and runs one transaction of INSERT INTO idem_inbox ... ON CONFLICT DO
//     NOTHING and, when a row was inserted, UPDATE counter, then
//     acknowledges.
//
// Each reports msgs/s, and checks that the counter and the inbox end with
// b.N each:
//
//	go test -run '^$' -bench ConsumerInbox -benchtime 5000x ./idemsqlite/
func BenchmarkConsumerInbox(b *testing.B) {
	b.Run("consumer", func(b *testing.B) { benchConsumer(b, false) })
	b.Run("pipeline", func(b *testing.B) { benchConsumer(b, true) })
	b.Run("minimal", benchMinimal)
}

const benchTopic = "payments.succeeded"

func benchCounterDB(b *testing.B) *idemsqlite.DB {
	b.Helper()
	db := benchDB(b)
	err := db.Migrate(b.Context(), "bench_counter", fstest.MapFS{
		"0001_counter.sql": {Data: []byte(`CREATE TABLE counter (n INTEGER NOT NULL); INSERT INTO counter VALUES (0);`)},
	})
	if err != nil {
		b.Fatal(err)
	}
	return db
}

func benchMessages(n int) []idem.Message {
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{
			ID:      fmt.Sprintf("evt-%d", i),
			Topic:   benchTopic,
			Key:     fmt.Sprintf("acct-%d", i%16),
			Payload: fmt.Appendf(nil, `{"event_id":"evt-%d","amount":1250}`, i),
		}
	}
	return msgs
}

// checkCounter fails the benchmark unless every message was applied
// exactly once.
func checkCounter(b *testing.B, db *idemsqlite.DB) {
	b.Helper()
	var n, rows int64
	if err := db.Reader().QueryRowContext(b.Context(), `SELECT (SELECT n FROM counter), (SELECT count(*) FROM idem_inbox)`).
		Scan(&n, &rows); err != nil {
		b.Fatal(err)
	}
	if n != int64(b.N) || rows != int64(b.N) {
		b.Fatalf("counter = %d and %d inbox rows after %d messages, want %d of each", n, rows, b.N, b.N)
	}
}

func benchConsumer(b *testing.B, sqliteTransport bool) {
	ctx := b.Context()
	db := benchCounterDB(b)
	var sub idem.Subscriber
	if sqliteTransport {
		tr := benchTransport(b, db)
		// The consumer name's cursor starts at the beginning of the log, so
		// the messages may be published before it subscribes.
		if err := tr.Publish(ctx, benchMessages(b.N)...); err != nil {
			b.Fatal(err)
		}
		sub = tr
	} else {
		tr := idemmem.NewTransport(nil)
		b.Cleanup(func() { tr.Close() })
		if err := tr.Publish(ctx, benchMessages(b.N)...); err != nil {
			b.Fatal(err)
		}
		sub = tr
	}
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	dls, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		b.Fatal(err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       benchTopic,
		Subscriber:  sub,
		Inbox:       inbox,
		DeadLetters: dls,
		Ledger:      ledger,
		InTx: func(ctx context.Context, fn func(context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
		Concurrency: 1,
	})
	if err != nil {
		b.Fatal(err)
	}
	handler := func(ctx context.Context, m idem.Message) error {
		return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1`)
			return err
		})
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	b.ResetTimer()
	start := time.Now()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx, handler) }()
	// Processed counts committed messages; polled, since nothing signals
	// the last one.
	deadline := time.Now().Add(5 * time.Minute)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for c.Stats().Processed < int64(b.N) {
		select {
		case err := <-ran:
			b.Fatalf("Run returned %v before every message was processed", err)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages processed after 5 minutes", c.Stats().Processed, b.N)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	if err := <-ran; err != nil {
		b.Fatalf("Run: %v", err)
	}
	checkCounter(b, db)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

func benchMinimal(b *testing.B) {
	ctx := b.Context()
	db := benchCounterDB(b)
	// The inbox table is idem_inbox itself: the minimum does the same
	// writes.
	if _, err := idemsqlite.NewInbox(ctx, db); err != nil {
		b.Fatal(err)
	}
	tr := idemmem.NewTransport(nil)
	b.Cleanup(func() { tr.Close() })
	if err := tr.Publish(ctx, benchMessages(b.N)...); err != nil {
		b.Fatal(err)
	}
	stream, err := tr.Subscribe(ctx, idem.Subscription{Topic: benchTopic, Consumer: "settlement"})
	if err != nil {
		b.Fatal(err)
	}
	defer stream.Close()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		d, err := stream.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, dedup_key, processed_at)
				VALUES (?, ?, ?) ON CONFLICT DO NOTHING`, "settlement", d.Message().ID, time.Now().UnixNano())
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				return err
			}
			_, err = tx.ExecContext(ctx, `UPDATE counter SET n = n + 1`)
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
	checkCounter(b, db)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkOutboxRelay measures relaying b.N outbox entries, 100 at a time,
// into the Transport of the same file: "claim" as the relay does with any
// Publisher (Claim, Publish, MarkSent: three write transactions per batch),
// "move" with Transport.MoveOutbox (one; skipped when the Transport is not
// an idem.OutboxMover). Reports msgs/s:
//
//	go test -run '^$' -bench OutboxRelay -benchtime 20000x ./idemsqlite/
func BenchmarkOutboxRelay(b *testing.B) {
	for _, move := range []bool{false, true} {
		name := map[bool]string{false: "claim", true: "move"}[move]
		b.Run(name, func(b *testing.B) {
			ctx := b.Context()
			db := benchDB(b)
			tr := benchTransport(b, db)
			ob, err := idemsqlite.NewOutbox(ctx, db, nil)
			if err != nil {
				b.Fatal(err)
			}
			mover, ok := any(tr).(idem.OutboxMover)
			if move && !ok {
				b.Skip("the Transport is not an idem.OutboxMover")
			}
			msgs := benchMessages(b.N)
			for i := 0; i < len(msgs); i += 500 {
				if err := ob.Add(ctx, msgs[i:min(i+500, len(msgs))]...); err != nil {
					b.Fatal(err)
				}
			}
			const limit = 100
			b.ResetTimer()
			start := time.Now()
			for left := b.N; left > 0; {
				if move {
					n, ok, err := mover.MoveOutbox(ctx, ob, limit)
					if err != nil || !ok || n == 0 {
						b.Fatalf("MoveOutbox = %d, %v, %v", n, ok, err)
					}
					left -= n
					continue
				}
				entries, err := ob.Claim(ctx, "relay", limit, time.Minute)
				if err != nil || len(entries) == 0 {
					b.Fatalf("Claim = %d entries, %v", len(entries), err)
				}
				batch := make([]idem.Message, len(entries))
				seqs := make([]int64, len(entries))
				for i, e := range entries {
					batch[i], seqs[i] = e.Message, e.Seq
				}
				if err := tr.Publish(ctx, batch...); err != nil {
					b.Fatal(err)
				}
				if err := ob.MarkSent(ctx, seqs...); err != nil {
					b.Fatal(err)
				}
				left -= len(entries)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}
