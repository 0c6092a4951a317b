package idempg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// roundTrips counts what a pgx connection sends and waits for: statements,
// batches (one round trip each, however many statements they hold) and
// preparations.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// count returns the round trips fn makes.
func (r *roundTrips) count(t *testing.T, fn func() error) int {
	t.Helper()
	before := r.n.Load()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
	return int(r.n.Load() - before)
}

// testURL returns the URL of the test PostgreSQL, or skips (or fails, with
// IDEM_REQUIRE_SERVICES=1) when it does not answer.
func testURL(t *testing.T) string {
	t.Helper()
	return idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// openTraced opens a DB on a fresh schema whose connections report to
// tracer, as Open would open it, and drops the schema when the test ends.
func openTraced(t *testing.T, tracer pgx.QueryTracer) *DB {
	t.Helper()
	url := testURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idempg_test_rt_" + hex.EncodeToString(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.Tracer = tracer
	cfg.ConnConfig.RuntimeParams["search_path"] = quoteIdent(schema)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := &DB{pool: pool, schema: schema, beginSQL: beginSQL(pgx.TxOptions{IsoLevel: pgx.ReadCommitted}), commitSQL: "commit"}
	t.Cleanup(func() {
		defer pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+quoteIdent(schema)+` CASCADE`); err != nil {
			t.Error(err)
		}
	})
	if err := db.createSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db
}

// A payment through the store costs no more round trips than the
// hand-written minimum (one transaction: INSERT of the key ... ON CONFLICT
// DO NOTHING, the balance update, the payment insert, the key's response
// update): the claim is one round trip of its own, and CompleteTx adds one
// to the work's statements, its COMMIT, because BEGIN travels with the
// work's first statement and the completion and the wake-up with COMMIT.
// The minimum pays BEGIN, the key's insert and its update on round trips of
// their own.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	tracer := &roundTrips{}
	db := openTraced(t, tracer)
	ctx := t.Context()
	if _, err := db.pool.Exec(ctx, `
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE payments (id bigserial PRIMARY KEY, account_id int NOT NULL, amount bigint NOT NULL);
		CREATE TABLE keys (key text PRIMARY KEY, status int, body bytea);
		INSERT INTO accounts VALUES (1, 1000000)`); err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	debit := func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - 1 WHERE id = $1`, 1); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO payments (account_id, amount) VALUES ($1, 1)`, 1)
		return err
	}
	body := []byte(`{"status":"succeeded"}`)
	minimum := func(key string) func() error {
		return func() error {
			return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, `INSERT INTO keys (key) VALUES ($1) ON CONFLICT DO NOTHING`, key)
				if err != nil {
					return err
				}
				if tag.RowsAffected() != 1 {
					return errors.New("key taken")
				}
				if err := debit(ctx, tx); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE keys SET status = $2, body = $3 WHERE key = $1`, key, 201, body)
				return err
			})
		}
	}
	req := func(key string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: idem.Key(key), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	var claim idem.Claim
	claimOf := func(key string) func() error {
		return func() (err error) {
			claim, err = s.Claim(ctx, req(key))
			return err
		}
	}
	completeTx := func(work func(ctx context.Context) error) func() error {
		return func() error {
			kept, err := s.CompleteTx(ctx, idem.Ref{Key: claim.Record.Key, Token: claim.Token}, func(ctx context.Context) (idem.Response, bool, error) {
				return idem.Response{Status: 201, Body: body}, true, work(ctx)
			})
			if err == nil && !kept {
				err = errors.New("not kept")
			}
			return err
		}
	}
	pay := func(ctx context.Context) error { return db.WithTx(ctx, debit) }
	nothing := func(context.Context) error { return nil }

	// Every statement once first, so that preparing them is not counted.
	for _, fn := range []func() error{minimum("warm"), claimOf("warm"), completeTx(pay), claimOf("warm"),
		claimOf("warm-2"), completeTx(nothing)} {
		if err := fn(); err != nil {
			t.Fatal(err)
		}
	}

	minRT := tracer.count(t, minimum("k1"))
	claimRT := tracer.count(t, claimOf("k2"))
	workRT := tracer.count(t, completeTx(pay))
	replayRT := tracer.count(t, claimOf("k2"))
	replay := claim
	if err := claimOf("k3")(); err != nil {
		t.Fatal(err)
	}
	emptyRT := tracer.count(t, completeTx(nothing))
	t.Logf("round trips: minimum %d; claim %d + CompleteTx of 2 statements %d; replay %d; CompleteTx without statements %d",
		minRT, claimRT, workRT, replayRT, emptyRT)

	if replay.Outcome != idem.Completed {
		t.Fatalf("replay claim = %v, want completed", replay.Outcome)
	}
	if claimRT != 1 {
		t.Errorf("claim of a new key: %d round trips, want 1", claimRT)
	}
	if workRT != 3 {
		t.Errorf("CompleteTx of work with 2 statements: %d round trips, want 3 (BEGIN with the first statement, the completion with COMMIT)", workRT)
	}
	if emptyRT != 1 {
		t.Errorf("CompleteTx of work without statements: %d round trips, want 1", emptyRT)
	}
	if claimRT+workRT > minRT {
		t.Errorf("store: %d round trips, more than the hand-written minimum's %d", claimRT+workRT, minRT)
	}
	if replayRT > 2 {
		t.Errorf("replay: %d round trips, want at most 2", replayRT)
	}

	// ClaimTx: the claim goes with BEGIN, the completion with COMMIT; a
	// replay reads the answer and rolls back in one round trip more.
	var txClaim idem.Claim
	claimTx := func(key string, work func(ctx context.Context) error) func() error {
		return func() (err error) {
			txClaim, _, err = s.ClaimTx(ctx, req(key), time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
				return idem.Response{Status: 201, Body: body}, true, work(ctx)
			})
			return err
		}
	}
	if err := claimTx("warm-3", pay)(); err != nil {
		t.Fatal(err)
	}
	claimTxRT := tracer.count(t, claimTx("k4", pay))
	if txClaim.Outcome != idem.Acquired {
		t.Fatalf("ClaimTx of a new key = %v, want acquired", txClaim.Outcome)
	}
	replayTxRT := tracer.count(t, claimTx("k4", pay))
	if txClaim.Outcome != idem.Completed {
		t.Fatalf("ClaimTx of a completed key = %v, want completed", txClaim.Outcome)
	}
	t.Logf("round trips: ClaimTx of 2 statements %d; its replay %d", claimTxRT, replayTxRT)
	if claimTxRT != 4 {
		t.Errorf("ClaimTx of work with 2 statements: %d round trips, want 4 (BEGIN with the claim, the completion with COMMIT)", claimTxRT)
	}
	if replayTxRT != 2 {
		t.Errorf("ClaimTx replay: %d round trips, want 2 (BEGIN with the claim, the answer with ROLLBACK)", replayTxRT)
	}
}
