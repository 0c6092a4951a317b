package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
)

// pgCounters are the counters the consumers increment, one row per key,
// and the hand-written minimum's queue.
const pgCounters = `
CREATE TABLE bench_counters (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
CREATE TABLE bench_queue (seq bigserial PRIMARY KEY, id text NOT NULL, key text NOT NULL, payload bytea NOT NULL);
`

func postgresBackend(url string) backend {
	return backend{name: "pg", open: func(ctx context.Context) (*world, error) { return openPostgres(ctx, url) }}
}

// openPostgres makes a world in a schema of its own, dropped by close.
func openPostgres(ctx context.Context, url string) (_ *world, err error) {
	var cl closers
	defer func() {
		if err != nil {
			cl.close()
		}
	}()
	schema := "idem_bench_msgs_" + randomID()
	db, err := idempg.Open(ctx, url, &idempg.Config{Schema: schema, MaxConns: 16})
	if err != nil {
		return nil, err
	}
	cl.add(func() {
		db.Pool().Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		db.Close()
	})
	if _, err := db.Pool().Exec(ctx, pgCounters); err != nil {
		return nil, fmt.Errorf("creating the counters: %w", err)
	}
	tr, err := idempg.NewTransport(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	cl.add(func() { tr.Close() })
	ob, err := idempg.NewOutbox(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	inbox, err := idempg.NewInbox(ctx, db)
	if err != nil {
		return nil, err
	}
	letters, err := idempg.NewDeadLetters(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	ledger, err := idempg.NewLedger(ctx, db)
	if err != nil {
		return nil, err
	}
	inTx := func(ctx context.Context, fn func(context.Context) error) error {
		return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
	}
	w := &world{
		transport: tr, sub: tr, outbox: ob, inbox: inbox, letters: letters, ledger: ledger, inTx: inTx,
		incr: func(ctx context.Context, key string) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO bench_counters (key, n) VALUES ($1, 1)
					ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + 1`, key)
				return err
			})
		},
		incrAll: func(ctx context.Context, keys []string) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO bench_counters (key, n)
					SELECT k, count(*) FROM unnest($1::text[]) AS k GROUP BY k ORDER BY k
					ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + excluded.n`, keys)
				return err
			})
		},
		check: func(ctx context.Context, consumer string, n int) error {
			var sum, rows int64
			err := db.Pool().QueryRow(ctx, `SELECT (SELECT coalesce(sum(n), 0) FROM bench_counters),
				(SELECT count(*) FROM idem_inbox WHERE consumer = $1)`, consumer).Scan(&sum, &rows)
			if err != nil {
				return err
			}
			if sum != int64(n) || rows != int64(n) {
				return fmt.Errorf("counters add up to %d and the inbox holds %d rows after %d messages", sum, rows, n)
			}
			return nil
		},
		byHand: func(ctx context.Context, consumer, id, key string) error {
			return pgx.BeginFunc(ctx, db.Pool(), func(tx pgx.Tx) error { return pgApply(ctx, tx, consumer, id, key) })
		},
		minimum: func(ctx context.Context, msgs []idem.Message, workers int) (time.Duration, error) {
			return pgMinimum(ctx, db, msgs, workers)
		},
		pipeline: func(ctx context.Context, n int) (pipelineFigures, error) {
			return runPipeline(ctx, payments.Config{Postgres: db}, n)
		},
		close: cl.close,
	}
	return w, nil
}

// pgMinimum is the consumer anyone could write by hand on PostgreSQL with
// the same guarantee: a queue table taken with SKIP LOCKED, and per
// message one transaction that records it in the inbox, increments its
// counter when the inbox had not seen it, and deletes it from the queue.
func pgMinimum(ctx context.Context, db *idempg.DB, msgs []idem.Message, workers int) (time.Duration, error) {
	pool := db.Pool()
	ids, keys, payloads := make([]string, len(msgs)), make([]string, len(msgs)), make([][]byte, len(msgs))
	for i, m := range msgs {
		ids[i], keys[i], payloads[i] = m.ID, m.Key, m.Payload
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bench_queue (id, key, payload)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, ids, keys, payloads); err != nil {
		return 0, fmt.Errorf("filling the queue: %w", err)
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	began := time.Now()
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				empty := false
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var seq int64
					var id, key string
					err := tx.QueryRow(ctx, `SELECT seq, id, key FROM bench_queue ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&seq, &id, &key)
					if err == pgx.ErrNoRows {
						empty = true
						return nil
					}
					if err != nil {
						return err
					}
					if err := pgApply(ctx, tx, minimumConsumer, id, key); err != nil {
						return err
					}
					_, err = tx.Exec(ctx, `DELETE FROM bench_queue WHERE seq = $1`, seq)
					return err
				})
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if empty {
					// Other workers may still hold the last rows.
					if done.Load() >= int64(len(msgs)) {
						return
					}
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return time.Since(began), ctx.Err()
}

// pgApply is the hand-written minimum's work for one message, in tx: the
// inbox row, and the counter when the row is new.
func pgApply(ctx context.Context, tx pgx.Tx, consumer, id, key string) error {
	tag, err := tx.Exec(ctx, `INSERT INTO idem_inbox (consumer, dedup_key, processed_at) VALUES ($1, $2, now())
		ON CONFLICT DO NOTHING`, consumer, id)
	if err != nil || tag.RowsAffected() == 0 {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO bench_counters (key, n) VALUES ($1, 1)
		ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + 1`, key)
	return err
}
