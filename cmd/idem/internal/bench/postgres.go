package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
)

const pgSchema = `
CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE bench_payments (id bigserial PRIMARY KEY, account_id int NOT NULL, amount bigint NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_keys (key text PRIMARY KEY, status int, body bytea, created_at timestamptz NOT NULL DEFAULT now());
`

func runPostgres(ctx context.Context, o *Options) ([]Comparison, error) {
	schema := "idem_bench_" + randomID()
	db, err := idempg.Open(ctx, o.PostgresURL, &idempg.Config{Schema: schema, MaxConns: int32(o.Concurrency) + 2})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer db.Close()
	defer db.Pool().Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")

	if _, err := db.Pool().Exec(ctx, pgSchema); err != nil {
		return nil, fmt.Errorf("bench: creating tables: %w", err)
	}
	if _, err := db.Pool().Exec(ctx, `INSERT INTO bench_accounts SELECT g, 1000000000 FROM generate_series(0, $1) g`, o.Concurrency*4); err != nil {
		return nil, fmt.Errorf("bench: creating accounts: %w", err)
	}
	store, err := idempg.NewStore(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer store.Close()
	m, err := idemhttp.New(o.middlewareConfig(store))
	if err != nil {
		return nil, err
	}
	accounts := o.Concurrency * 4
	// The handler does the payment's work in the key's transaction: the
	// balance update and the payment insert; the middleware adds the claim
	// and the key's completion.
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acct := r.Context().Value(accountKey{}).(int)
		waitBeforeWrites(r.Context())
		err := db.WithTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			return debit(ctx, tx, acct)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeAnswer(w)
	}))
	// Both sides are served through the same in-process HTTP path.
	serveAs := func(ctx context.Context, key string, acct int) error { return servePayment(ctx, h, key, acct) }
	minimumHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get(idemhttp.HeaderKey)
		acct := ctx.Value(accountKey{}).(int)
		rr := httptest.NewRecorder()
		waitBeforeWrites(ctx)
		err := pgx.BeginFunc(ctx, db.Pool(), func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO bench_keys (key) VALUES ($1) ON CONFLICT DO NOTHING`, key)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("key %s already claimed", key)
			}
			if err := debit(ctx, tx, acct); err != nil {
				return err
			}
			writeAnswer(rr)
			_, err = tx.Exec(ctx, `UPDATE bench_keys SET status = $2, body = $3 WHERE key = $1`, key, rr.Code, rr.Body.Bytes())
			return err
		})
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
		if err := db.Pool().QueryRow(r.Context(), `SELECT status, body FROM bench_keys WHERE key = $1`, r.Header.Get(idemhttp.HeaderKey)).Scan(&status, &b); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(b)
	})

	middlewareFirst := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return serveAs(ctx, fmt.Sprintf("first-%d-%d", round, i), i%accounts)
	}}
	minimumFirst := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		return servePayment(ctx, minimumHandler, fmt.Sprintf("min-%d-%d", round, i), i%accounts)
	}}
	first, err := compare(ctx, o, "postgres", "first", middlewareFirst, minimumFirst)
	if err != nil {
		return nil, err
	}

	if err := serveAs(ctx, "replayed", 0); err != nil {
		return nil, err
	}
	if err := minimumFirst.do(ctx, -1, 0); err != nil {
		return nil, err
	}
	middlewareReplay := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return serveAs(ctx, "replayed", 0)
	}}
	minimumReplay := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		return servePayment(ctx, minimumReplayHandler, "min--1-0", 0)
	}}
	replay, err := compare(ctx, o, "postgres", "replay", middlewareReplay, minimumReplay)
	if err != nil {
		return nil, err
	}
	out := []Comparison{first, replay}
	if o.SlowHandler > 0 {
		mw, min := slowSides(o, accounts, h, minimumHandler)
		slow, err := compare(ctx, o, "postgres", "slow", mw, min)
		if err != nil {
			return nil, err
		}
		out = append(out, slow)
	}
	if o.GRPC {
		gs, err := grpcPostgres(ctx, o, db, store, accounts)
		if err != nil {
			return out, err
		}
		out = append(out, gs...)
	}
	return out, nil
}

type accountKey struct{}

func debit(ctx context.Context, tx pgx.Tx, acct int) error {
	tag, err := tx.Exec(ctx, `UPDATE bench_accounts SET balance = balance - 1 WHERE id = $1 AND balance >= 1`, acct)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return errors.New("insufficient funds")
	}
	_, err = tx.Exec(ctx, `INSERT INTO bench_payments (account_id, amount) VALUES ($1, 1)`, acct)
	return err
}
