package idempgsql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the driver "pgx"
	_ "github.com/lib/pq"              // the driver "postgres"

	"github.com/idem-go/idem/idempgsql"
	"github.com/idem-go/idem/idemtest"
)

// drivers are the database/sql drivers every test runs on: pgx's stdlib
// and lib/pq.
var drivers = []string{"pgx", "postgres"}

// eachDriver runs fn as a parallel subtest of t per driver.
func eachDriver(t *testing.T, fn func(t *testing.T, driver string)) {
	t.Helper()
	pgURL(t)
	for _, d := range drivers {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			fn(t, d)
		})
	}
}

// pgURL returns the URL of the test PostgreSQL, or skips (or fails, with
// IDEM_REQUIRE_SERVICES=1) when it does not answer.
func pgURL(t testing.TB) string {
	t.Helper()
	return idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
}

// randomName returns prefix followed by random hex, a name no other test
// uses.
func randomName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// withParam returns url with the parameter "name=value" param added.
func withParam(url, param string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + param
}

// openSQL opens a *sql.DB with driver whose connections use a fresh schema
// (their search_path), dropped with everything in it when the test ends,
// and at most 4 connections: the machine's PostgreSQL is shared. params
// are added to the connection string ("name=value").
func openSQL(t testing.TB, driver string, params ...string) *sql.DB {
	t.Helper()
	url := pgURL(t)
	schema := randomName("idempgsql_test_")
	admin, err := sql.Open(driver, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.ExecContext(t.Context(), `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	url = withParam(url, "search_path="+schema)
	for _, p := range params {
		url = withParam(url, p)
	}
	db, err := sql.Open(driver, url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

// openDB is a DB with cfg on a fresh *sql.DB of driver (openSQL).
func openDB(t testing.TB, driver string, cfg idempgsql.Config) *idempgsql.DB {
	t.Helper()
	db, err := idempgsql.NewDB(t.Context(), openSQL(t, driver), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func newStore(t testing.TB, db *idempgsql.DB) *idempgsql.Store {
	t.Helper()
	s, err := idempgsql.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newInbox(t testing.TB, db *idempgsql.DB) *idempgsql.Inbox {
	t.Helper()
	in, err := idempgsql.NewInbox(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// effects is the suites' view of an application's own table, written
// through WithTx so that inside Process or CompleteTx it joins their
// transaction.
type effects struct{ db *idempgsql.DB }

func newEffects(t testing.TB, db *idempgsql.DB) effects {
	t.Helper()
	err := db.Migrate(t.Context(), "test_effects", fstest.MapFS{
		"0001_effects.sql": {Data: []byte(`CREATE TABLE effects (tag text NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return effects{db}
}

var errNoTx = errors.New("the context carries no transaction")

func (e effects) Write(ctx context.Context, tag string) error {
	// A write outside the inbox's transaction would commit on its own:
	// refuse it, as the suites ask.
	if !carriesTx(ctx, e.db) {
		return errNoTx
	}
	return e.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (tag) VALUES ($1)`, tag)
		return err
	})
}

// carriesTx reports whether ctx carries a transaction of db: WithTx joins
// it and hands fn the same context, where otherwise it hands a new one
// carrying its own transaction.
func carriesTx(ctx context.Context, db *idempgsql.DB) bool {
	joined := false
	_ = db.WithTx(ctx, func(inner context.Context, _ *sql.Tx) error {
		joined = inner == ctx
		return nil
	})
	return joined
}

func (e effects) Count(ctx context.Context, tag string) (int, error) {
	var n int
	err := e.db.SQL().QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE tag = $1`, tag).Scan(&n)
	return n, err
}
