package ormtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the driver "pgx"
	_ "github.com/lib/pq"              // the driver "postgres"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempgsql"
	"github.com/idem-go/idem/idemtest"
)

// drivers are the database/sql drivers every test runs on: pgx's stdlib
// and lib/pq.
var drivers = []string{"pgx", "postgres"}

const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// eachDriver runs fn as a parallel subtest of t per driver.
func eachDriver(t *testing.T, fn func(t *testing.T, driver string)) {
	t.Helper()
	idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
	for _, d := range drivers {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			fn(t, d)
		})
	}
}

func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}

// env is what a test works with: an application's *sql.DB on a schema of
// its own (dropped when the test ends), with its tables orders and
// totals, and idempgsql's DB, Store, Inbox and Outbox on it.
type env struct {
	t      *testing.T
	ctx    context.Context
	driver string
	sql    *sql.DB
	db     *idempgsql.DB
	store  *idempgsql.Store
	inbox  *idempgsql.Inbox
	outbox *idempgsql.Outbox
}

func newEnv(t *testing.T, driver string) *env {
	t.Helper()
	ctx := t.Context()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idem_orm_" + hex.EncodeToString(b)
	admin, err := sql.Open(driver, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	sqldb, err := sql.Open(driver, withParam(url, "search_path="+schema))
	if err != nil {
		t.Fatal(err)
	}
	sqldb.SetMaxOpenConns(4) // the machine's PostgreSQL is shared
	t.Cleanup(func() { sqldb.Close() })
	if _, err := sqldb.ExecContext(ctx, `CREATE TABLE orders (id text PRIMARY KEY, item text NOT NULL);
		CREATE TABLE totals (tenant text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	db, err := idempgsql.NewDB(ctx, sqldb, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, driver: driver, sql: sqldb, db: db}
	if e.store, err = idempgsql.NewStore(ctx, db); err != nil {
		t.Fatal(err)
	}
	if e.inbox, err = idempgsql.NewInbox(ctx, db); err != nil {
		t.Fatal(err)
	}
	if e.outbox, err = idempgsql.NewOutbox(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	return e
}

// Order is a row of orders; Total, a row of totals.
type Order struct {
	ID   string `gorm:"primaryKey" db:"id"`
	Item string `db:"item"`
}

type Total struct {
	Tenant string `gorm:"primaryKey" db:"tenant"`
	Amount int64  `db:"amount"`
}

// addSQL adds $1 to the total of the tenant "acme": an effect that is not
// idempotent by itself, so that a message applied twice shows.
const addSQL = `INSERT INTO totals (tenant, amount) VALUES ('acme', $1)
	ON CONFLICT (tenant) DO UPDATE SET amount = totals.amount + excluded.amount`

// total is the committed total of "acme".
func (e *env) total() int64 {
	e.t.Helper()
	var n int64
	err := e.sql.QueryRowContext(e.ctx, `SELECT coalesce(sum(amount), 0) FROM totals`).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// count counts the committed rows of table.
func (e *env) count(table string) int {
	e.t.Helper()
	var n int
	if err := e.sql.QueryRowContext(e.ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// redelivered reports whether a delivery of message id now runs (its row
// was rolled back) rather than being a duplicate, and fails the test on
// any other answer. A delivery that runs commits nothing but its row.
func (e *env) redelivered(id string) bool {
	e.t.Helper()
	err := e.inbox.Process(e.ctx, "settlement", id, func(context.Context) error { return nil })
	switch {
	case err == nil:
		return true
	case errors.Is(err, idem.ErrDuplicate):
		return false
	}
	e.t.Fatalf("the redelivery of %s: %v", id, err)
	return false
}

// failOn makes inserts into idem_outbox of a message whose topic is
// "fail" fail with a deadlock (40P01): a failure of idem's own statement
// in the middle of the application's transaction.
func (e *env) failOn() {
	e.t.Helper()
	_, err := e.sql.ExecContext(e.ctx, `
CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.topic = 'fail' THEN
		RAISE EXCEPTION 'the test fails this insert' USING ERRCODE = '40P01';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER test_fail BEFORE INSERT ON idem_outbox FOR EACH ROW EXECUTE FUNCTION test_fail();`)
	if err != nil {
		e.t.Fatal(err)
	}
}

var errFail = errors.New("a business rule failed")

// serve runs handler behind the idemhttp middleware on the env's Store,
// whose answers are kept in the transaction the handler reaches with
// DB.WithTx, and returns a function that POSTs body with an idempotency
// key and returns the status, the body and whether it was replayed.
func (e *env) serve(handler http.HandlerFunc) func(key, body string) (int, string, bool) {
	e.t.Helper()
	mw, err := idemhttp.New(&idemhttp.Config{Store: e.store, SharedScope: true})
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(handler))
	e.t.Cleanup(srv.Close)
	return func(key, body string) (int, string, bool) {
		e.t.Helper()
		req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		if err != nil {
			e.t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			e.t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			e.t.Fatal(err)
		}
		return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"
	}
}
