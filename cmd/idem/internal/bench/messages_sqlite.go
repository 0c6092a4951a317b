package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

const sqliteCounters = `
CREATE TABLE bench_counters (key TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0);
CREATE TABLE bench_queue (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, key TEXT NOT NULL, payload BLOB NOT NULL);
`

func sqliteBackend(dir string) backend {
	return backend{name: "sqlite", open: func(ctx context.Context) (*world, error) { return openSQLite(ctx, dir) }}
}

func makeTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	return dir, nil
}

func removeAll(dir string) { os.RemoveAll(dir) }

// openSQLite makes a world on a new file in dir, removed by close.
func openSQLite(ctx context.Context, dir string) (_ *world, err error) {
	var cl closers
	defer func() {
		if err != nil {
			cl.close()
		}
	}()
	path := filepath.Join(dir, "bench-"+randomID()+".db")
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		return nil, err
	}
	cl.add(func() {
		db.Close()
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(path + suffix)
		}
	})
	if _, err := db.Writer().ExecContext(ctx, sqliteCounters); err != nil {
		return nil, fmt.Errorf("creating the counters: %w", err)
	}
	tr, err := idemsqlite.NewTransport(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	cl.add(func() { tr.Close() })
	ob, err := idemsqlite.NewOutbox(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		return nil, err
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		return nil, err
	}
	inTx := func(ctx context.Context, fn func(context.Context) error) error {
		return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
	}
	w := &world{
		transport: tr, sub: tr, outbox: ob, inbox: inbox, letters: letters, ledger: ledger, inTx: inTx,
		incr: func(ctx context.Context, key string) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO bench_counters (key, n) VALUES (?, 1)
					ON CONFLICT (key) DO UPDATE SET n = n + 1`, key)
				return err
			})
		},
		incrAll: func(ctx context.Context, keys []string) error {
			list, err := json.Marshal(keys)
			if err != nil {
				return err
			}
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO bench_counters (key, n)
					SELECT value, count(*) FROM json_each(?) WHERE true GROUP BY value
					ON CONFLICT (key) DO UPDATE SET n = n + excluded.n`, string(list))
				return err
			})
		},
		check: func(ctx context.Context, consumer string, n int) error {
			var sum, rows int64
			err := db.Reader().QueryRowContext(ctx, `SELECT (SELECT coalesce(sum(n), 0) FROM bench_counters),
				(SELECT count(*) FROM idem_inbox WHERE consumer = ?)`, consumer).Scan(&sum, &rows)
			if err != nil {
				return err
			}
			if sum != int64(n) || rows != int64(n) {
				return fmt.Errorf("counters add up to %d and the inbox holds %d rows after %d messages", sum, rows, n)
			}
			return nil
		},
		byHand: func(ctx context.Context, consumer, id, key string) error {
			tx, err := db.Writer().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := sqliteApply(ctx, tx, consumer, id, key); err != nil {
				return err
			}
			return tx.Commit()
		},
		minimum: func(ctx context.Context, msgs []idem.Message, workers int) (time.Duration, error) {
			return sqliteMinimum(ctx, db, msgs, workers)
		},
		pipeline: func(ctx context.Context, n int) (pipelineFigures, error) {
			return runPipeline(ctx, payments.Config{DB: db}, n)
		},
		close: cl.close,
	}
	return w, nil
}

// sqliteMinimum is the hand-written consumer on SQLite: a queue table and,
// per message, one write transaction on the single writer connection (as
// idemsqlite opens it: WAL, synchronous=FULL) that takes the oldest row,
// records it in the inbox, increments its counter when the inbox had not
// seen it, and deletes it.
func sqliteMinimum(ctx context.Context, db *idemsqlite.DB, msgs []idem.Message, workers int) (time.Duration, error) {
	w := db.Writer()
	if err := func() error {
		tx, err := w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		for _, m := range msgs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO bench_queue (id, key, payload) VALUES (?, ?, ?)`, m.ID, m.Key, m.Payload); err != nil {
				return err
			}
		}
		return tx.Commit()
	}(); err != nil {
		return 0, fmt.Errorf("filling the queue: %w", err)
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	began := time.Now()
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil && done.Load() < int64(len(msgs)) {
				err := func() error {
					tx, err := w.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					var seq int64
					var id, key string
					err = tx.QueryRowContext(ctx, `SELECT seq, id, key FROM bench_queue ORDER BY seq LIMIT 1`).Scan(&seq, &id, &key)
					if errors.Is(err, sql.ErrNoRows) {
						return nil
					}
					if err != nil {
						return err
					}
					if err := sqliteApply(ctx, tx, minimumConsumer, id, key); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, `DELETE FROM bench_queue WHERE seq = ?`, seq); err != nil {
						return err
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					done.Add(1)
					return nil
				}()
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return time.Since(began), ctx.Err()
}

// sqliteApply is the hand-written minimum's work for one message, in tx:
// the inbox row, and the counter when the row is new.
func sqliteApply(ctx context.Context, tx *sql.Tx, consumer, id, key string) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO idem_inbox (consumer, dedup_key, processed_at) VALUES (?, ?, ?)
		ON CONFLICT DO NOTHING`, consumer, id, time.Now().UnixNano())
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO bench_counters (key, n) VALUES (?, 1)
		ON CONFLICT (key) DO UPDATE SET n = n + 1`, key)
	return err
}
