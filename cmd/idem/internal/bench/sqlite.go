package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

const sqliteSchema = `
CREATE TABLE bench_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE bench_payments (id INTEGER PRIMARY KEY AUTOINCREMENT, account_id INTEGER NOT NULL, amount INTEGER NOT NULL,
	created_at INTEGER NOT NULL DEFAULT (unixepoch()));
CREATE TABLE bench_keys (key TEXT PRIMARY KEY, status INTEGER, body BLOB, created_at INTEGER NOT NULL DEFAULT (unixepoch()));
`

// runSQLite measures the middleware on idemsqlite against the hand-written
// minimum on the same file: one write transaction on the single writer
// (WAL, synchronous=FULL, as idemsqlite opens it) with the key's INSERT …
// ON CONFLICT DO NOTHING, the balance update, the payment insert and the
// key's response update; replays read the key from the read pool.
func runSQLite(ctx context.Context, o *Options) ([]Comparison, error) {
	dir, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "bench.db"), nil)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer db.Close()
	if _, err := db.Writer().ExecContext(ctx, sqliteSchema); err != nil {
		return nil, fmt.Errorf("bench: creating tables: %w", err)
	}
	accounts := o.Concurrency * 4
	if _, err := db.Writer().ExecContext(ctx, `WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < ?)
		INSERT INTO bench_accounts SELECT i, 1000000000 FROM g`, accounts); err != nil {
		return nil, fmt.Errorf("bench: creating accounts: %w", err)
	}
	store, err := idemsqlite.NewStore(ctx, db, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	m, err := idemhttp.New(o.middlewareConfig(store))
	if err != nil {
		return nil, err
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acct := r.Context().Value(accountKey{}).(int)
		waitBeforeWrites(r.Context())
		err := db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error { return sqliteDebit(ctx, tx, acct) })
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeAnswer(w)
	}))
	minimumHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.HeaderKey)
		acct := ctx.Value(accountKey{}).(int)
		rr := httptest.NewRecorder()
		waitBeforeWrites(ctx)
		err := func() error {
			tx, err := db.Writer().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			res, err := tx.ExecContext(ctx, `INSERT INTO bench_keys (key) VALUES (?) ON CONFLICT DO NOTHING`, key)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return fmt.Errorf("key %s already claimed", key)
			}
			if err := sqliteDebit(ctx, tx, acct); err != nil {
				return err
			}
			writeAnswer(rr)
			if _, err := tx.ExecContext(ctx, `UPDATE bench_keys SET status = ?, body = ? WHERE key = ?`, rr.Code, rr.Body.Bytes(), key); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rr.Code)
		w.Write(rr.Body.Bytes())
	})
	minimumReplayHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var status int
		var b []byte
		if err := db.Reader().QueryRowContext(r.Context(), `SELECT status, body FROM bench_keys WHERE key = ?`,
			r.Header.Get(idemhttp.HeaderKey)).Scan(&status, &b); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(b)
	})
	middlewareFirst := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return servePayment(ctx, h, fmt.Sprintf("first-%d-%d", round, i), i%accounts)
	}}
	minimumFirst := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		return servePayment(ctx, minimumHandler, fmt.Sprintf("min-%d-%d", round, i), i%accounts)
	}}
	first, err := compare(ctx, o, "sqlite", "first", middlewareFirst, minimumFirst)
	if err != nil {
		return nil, err
	}
	if err := servePayment(ctx, h, "replayed", 0); err != nil {
		return nil, err
	}
	if err := minimumFirst.do(ctx, -1, 0); err != nil {
		return nil, err
	}
	replay, err := compare(ctx, o, "sqlite", "replay",
		side{name: "middleware", do: func(ctx context.Context, round, i int) error { return servePayment(ctx, h, "replayed", 0) }},
		side{name: "minimum", do: func(ctx context.Context, round, i int) error {
			return servePayment(ctx, minimumReplayHandler, "min--1-0", 0)
		}})
	if err != nil {
		return nil, err
	}
	out := []Comparison{first, replay}
	if o.SlowHandler > 0 {
		mw, min := slowSides(o, accounts, h, minimumHandler)
		slow, err := compare(ctx, o, "sqlite", "slow", mw, min)
		if err != nil {
			return nil, err
		}
		out = append(out, slow)
	}
	if o.GRPC {
		gs, err := grpcSQLite(ctx, o, db, store, accounts)
		if err != nil {
			return out, err
		}
		out = append(out, gs...)
	}
	return out, nil
}

func sqliteDebit(ctx context.Context, tx *sql.Tx, acct int) error {
	res, err := tx.ExecContext(ctx, `UPDATE bench_accounts SET balance = balance - 1 WHERE id = ? AND balance >= 1`, acct)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errors.New("insufficient funds")
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO bench_payments (account_id, amount) VALUES (?, 1)`, acct)
	return err
}
