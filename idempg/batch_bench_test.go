package idempg_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// BenchmarkBatchCommit compares the two ways a batch of messages can share
// one transaction without a failing message taking its batch-mates with it,
// each a loop over the PostgreSQL transport taking 100 deliveries at a
// time, incrementing each message's counter in the inbox's transaction and
// acknowledging the batch in it:
//
//   - optimistic: Inbox.ProcessBatch records the 100 keys in one INSERT,
//     the handlers run without savepoints, one COMMIT; a failure would roll
//     the batch back and try it again without the failing message (what the
//     consumer package does);
//   - savepoints: one transaction, in which each message goes through
//     Inbox.Process, which joins it inside a savepoint of its own (its
//     INSERT, its handler, RELEASE), one COMMIT;
//   - one-per-tx: each message in a transaction of its own, as without
//     batches.
//
// Each reports msgs/s, over b.N messages spread over 100 keys:
//
//	go test -run '^$' -bench BatchCommit -benchtime 20000x ./idempg/
func BenchmarkBatchCommit(b *testing.B) {
	for _, mode := range []string{"optimistic", "savepoints", "one-per-tx"} {
		b.Run(mode, func(b *testing.B) { benchBatchCommit(b, mode) })
	}
}

func benchBatchCommit(b *testing.B, mode string) {
	ctx := b.Context()
	db := openDB(b, pgURL(b), idempg.Config{MaxConns: 4})
	if _, err := db.Pool().Exec(ctx, `CREATE TABLE bench_counters (key text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	tr := newTransport(b, db, idempg.TransportConfig{})
	inbox, err := idempg.NewInbox(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	s, err := tr.Subscribe(ctx, idem.Subscription{Topic: benchTopic, Consumer: "settlement", MaxInFlight: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	bs := s.(idem.BatchStream)
	for i := 0; i < b.N; i += 1000 {
		var msgs []idem.Message
		for j := i; j < min(i+1000, b.N); j++ {
			msgs = append(msgs, idem.Message{ID: fmt.Sprint("evt-", j), Topic: benchTopic, Key: fmt.Sprint("acct-", j%100)})
		}
		if err := tr.Publish(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	incr := func(ctx context.Context, key string) error {
		return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO bench_counters (key, n) VALUES ($1, 1)
				ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + 1`, key)
			return err
		})
	}
	limit := 100
	if mode == "one-per-tx" {
		limit = 1
	}
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; {
		ds, err := bs.NextBatch(ctx, limit)
		if err != nil {
			b.Fatal(err)
		}
		err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
			switch mode {
			case "savepoints":
				for _, d := range ds {
					m := d.Message()
					if err := inbox.Process(ctx, "settlement", m.ID, func(ctx context.Context) error { return incr(ctx, m.Key) }); err != nil {
						return err
					}
				}
			default:
				keys := make([]string, len(ds))
				for i, d := range ds {
					keys[i] = d.Message().ID
				}
				err := inbox.ProcessBatch(ctx, "settlement", keys, func(ctx context.Context, fresh []bool) error {
					for i, d := range ds {
						if fresh[i] {
							if err := incr(ctx, d.Message().Key); err != nil {
								return err
							}
						}
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			_, err := bs.AckBatch(ctx, ds)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		done += len(ds)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	var sum int64
	if err := db.Pool().QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM bench_counters`).Scan(&sum); err != nil {
		b.Fatal(err)
	}
	if sum != int64(b.N) {
		b.Fatalf("counters add up to %d after %d messages", sum, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
