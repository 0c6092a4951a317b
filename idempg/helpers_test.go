package idempg_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// pgURL returns the URL of the test PostgreSQL, or skips (or fails, with
// IDEM_REQUIRE_SERVICES=1) when it does not answer.
func pgURL(t testing.TB) string {
	t.Helper()
	return idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
}

// defaultPostgresURL is the machine's PostgreSQL, used when
// IDEM_POSTGRES_URL is not set.
const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// randomName returns prefix followed by random hex, a name no other test
// uses.
func randomName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// freshSchema returns the name of a schema no other test uses, dropped with
// everything in it when the test ends (after the DBs opened later are
// closed: cleanups run last-registered first).
func freshSchema(t testing.TB, url string) string {
	t.Helper()
	schema := randomName("idempg_test_")
	t.Cleanup(func() { dropSchema(t, url, schema) })
	return schema
}

func dropSchema(t testing.TB, url, schema string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Errorf("dropping schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
		t.Errorf("dropping schema %s: %v", schema, err)
	}
}

// openDB opens a DB on url with cfg (a fresh schema when cfg names none, and
// at most 4 connections unless it says otherwise), closed when the test
// ends.
func openDB(t testing.TB, url string, cfg idempg.Config) *idempg.DB {
	t.Helper()
	if cfg.Schema == "" {
		cfg.Schema = freshSchema(t, url)
	}
	if cfg.MaxConns == 0 {
		// The machine's PostgreSQL is shared: keep each test's share small.
		cfg.MaxConns = 4
	}
	db, err := idempg.Open(t.Context(), url, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, "the DB", db.Close) })
	return db
}

// closeWithin runs fn, a Close, and fails the test if it has not returned within
// waitBound. A DB's Close waits for every connection to be given back: a
// Rows or a transaction left open by the code under test would otherwise
// hang the package until go test's timeout, naming nothing.
func closeWithin(t testing.TB, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	timer := time.NewTimer(waitBound)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Errorf("%s did not close within %v: a connection was not given back (a Rows or a transaction left open?)", what, waitBound)
	}
}

func newStore(t testing.TB, db *idempg.DB) *idempg.Store {
	t.Helper()
	s, err := idempg.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// withAppName returns url with the application_name parameter set, so a
// test can find its own sessions in pg_stat_activity.
func withAppName(url, name string) string { return withParam(url, "application_name="+name) }

// withExecMode returns url with pgx's default_query_exec_mode set to exec:
// statements are then described and run unnamed, as behind a connection
// pooler that keeps no prepared statements.
func withExecMode(url string) string { return withParam(url, "default_query_exec_mode=exec") }

// withParam returns url with the parameter "name=value" param added.
func withParam(url, param string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + param
}

// migratePayments creates the application table the tests write to, in the
// same schema as the keys, the way the payment service does. It has no
// unique constraint: only the store's fencing keeps a second execution's
// payment out.
func migratePayments(t testing.TB, db *idempg.DB) {
	t.Helper()
	err := db.Migrate(t.Context(), "test_payments", fstest.MapFS{
		"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id text NOT NULL, amount bigint NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// insertPayment writes a payment the way a handler does: through WithTx,
// so that inside CompleteTx's work it joins the transaction.
func insertPayment(ctx context.Context, db *idempg.DB, id string) error {
	return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, id, 1250)
		return err
	})
}

// payments returns the committed payment ids, in order.
func payments(t testing.TB, db *idempg.DB) []string {
	t.Helper()
	rows, err := db.Pool().Query(t.Context(), `SELECT id FROM payments ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// dbNow reads the database's clock.
func dbNow(t testing.TB, db *idempg.DB) time.Time {
	t.Helper()
	var now time.Time
	if err := db.Pool().QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

func mustClaim(t testing.TB, s idem.Store, req idem.ClaimRequest) idem.Claim {
	t.Helper()
	c, err := s.Claim(t.Context(), req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim(%s) = %v, %v; want acquired", req.Key, c.Outcome, err)
	}
	return c
}

func refOf(c idem.Claim) idem.Ref {
	return idem.Ref{Scope: c.Record.Scope, Key: c.Record.Key, Token: c.Token}
}

// waitFor polls cond until it holds, failing the test when ctx ends
// first.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	for {
		ok, err := cond()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not by the deadline", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
