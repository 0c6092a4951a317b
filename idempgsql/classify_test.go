package idempgsql_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgsql"
)

func transient(err error) bool { return idempgsql.Classify(err) == idem.ClassTransient }

func classify(err error) idem.ErrorClass { return idempgsql.Classify(err) }

// Classify reads the SQLSTATE of real errors of both drivers: the
// transient ones (a serialization failure, a deadlock, a connection the
// server ended) are retried, the permanent ones (a unique violation, a
// data exception, a missing table) are not, and Classified marks those
// for idem.Classify.
func TestClassify(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		db := openDB(t, driver, idempgsql.Config{})
		if _, err := db.SQL().ExecContext(ctx, `CREATE TABLE uniq (id int PRIMARY KEY); INSERT INTO uniq VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		raise := func(code string) string {
			return `DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '` + code + `'; END $$`
		}
		for _, c := range []struct {
			stmt, code string
			class      idem.ErrorClass
		}{
			{raise("40001"), "40001", idem.ClassTransient},
			{raise("40P01"), "40P01", idem.ClassTransient},
			{raise("55P03"), "55P03", idem.ClassTransient},
			{raise("53300"), "53300", idem.ClassTransient},
			{raise("57014"), "57014", idem.ClassTransient},
			{`INSERT INTO uniq VALUES (1)`, "23505", idem.ClassPermanent},
			{`SELECT 1/0`, "22012", idem.ClassPermanent},
			{`SELECT * FROM no_such_table`, "42P01", idem.ClassPermanent},
			{raise("P0001"), "P0001", idem.ClassTransient}, // unknown: as idem.Classify classes it
		} {
			_, err := db.SQL().ExecContext(ctx, c.stmt)
			if got := idempgsql.SQLState(err); got != c.code {
				t.Errorf("%s: SQLState(%v) = %q, want %q", c.stmt, err, got, c.code)
			}
			wrapped := errors.Join(errors.New("the handler failed"), err)
			if got := idempgsql.Classify(wrapped); got != c.class {
				t.Errorf("%s: Classify(%v) = %v, want %v", c.stmt, err, got, c.class)
			}
			if got := idem.Classify(idempgsql.Classified(wrapped)); got != c.class {
				t.Errorf("%s: idem.Classify(Classified(%v)) = %v, want %v", c.stmt, err, got, c.class)
			}
		}
		// A connection the server ends: whatever the driver makes of it,
		// transient.
		conn, err := db.SQL().Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = conn.ExecContext(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
		if err == nil {
			_, err = conn.ExecContext(ctx, `SELECT 1`)
		}
		if err == nil || idempgsql.Classify(err) != idem.ClassTransient {
			t.Errorf("a connection the server ended: Classify(%v) = %v, want transient", err, idempgsql.Classify(err))
		}
		if idempgsql.Classified(nil) != nil || idempgsql.SQLState(nil) != "" {
			t.Error("Classified(nil) or SQLState(nil) is not nil or empty")
		}
		if got := idempgsql.Classify(idem.Permanent(context.DeadlineExceeded)); got != idem.ClassPermanent {
			t.Errorf("Classify of an error marked permanent = %v", got)
		}
	})
}

// The failures that are the database's, not the message's, are transient,
// whatever their SQLSTATE's class says of a statement: a server that
// refuses the connection's role or database (28000, 3D000: credentials
// rotated, a database being restored) is a store that is down; and a
// statement whose cached plan a schema change made stale (0A000, "cached
// plan must not change result type": pgx's stdlib caches every statement,
// and an application's *sql.Stmt is prepared) fails on that connection
// only, and runs on a new one. A message that no retry can store (an index
// row over PostgreSQL's limit, 54000) is permanent.
func TestClassifyTheDatabasesOwnFailures(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		u, err := url.Parse(pgURL(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ what, code string }{{"role", "28000"}, {"database", "3D000"}} {
			bad := *u
			switch c.what {
			case "role":
				bad.User = url.User(randomName("no_such_role_"))
			case "database":
				bad.Path = "/" + randomName("no_such_database_")
			}
			refused, err := sql.Open(driver, bad.String())
			if err != nil {
				t.Fatal(err)
			}
			err = refused.PingContext(ctx)
			refused.Close()
			if got := idempgsql.SQLState(err); got != c.code {
				t.Fatalf("connecting with a %s that does not exist = %v (SQLSTATE %q), want %s", c.what, err, got, c.code)
			}
			if got := idempgsql.Classify(err); got != idem.ClassTransient {
				t.Errorf("a server that refuses the connection's %s: Classify(%v) = %v, want transient", c.what, err, got)
			}
		}

		sqldb := openSQL(t, driver)
		sqldb.SetMaxOpenConns(1) // the statement's cached plan lives on this connection
		if _, err := sqldb.ExecContext(ctx, `CREATE TABLE orders (id int); INSERT INTO orders VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		const query = `SELECT * FROM orders`
		stmt, err := sqldb.PrepareContext(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		read := func(rows *sql.Rows, err error) error {
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
			}
			return rows.Err()
		}
		if err := read(stmt.QueryContext(ctx)); err != nil {
			t.Fatal(err)
		}
		if err := read(sqldb.QueryContext(ctx, query)); err != nil {
			t.Fatal(err)
		}
		// A migration, as a deploy runs it beside the service.
		if _, err := sqldb.ExecContext(ctx, `ALTER TABLE orders ADD COLUMN note text`); err != nil {
			t.Fatal(err)
		}
		err = read(stmt.QueryContext(ctx))
		if got := idempgsql.SQLState(err); got != "0A000" {
			t.Fatalf("the prepared statement after the migration = %v (SQLSTATE %q), want 0A000", err, got)
		}
		if got := idempgsql.Classify(err); got != idem.ClassTransient {
			t.Errorf("a plan made stale by a migration: Classify(%v) = %v, want transient", err, got)
		}
		fresh := openSQLOn(t, driver, sqldb)
		if err := read(fresh.QueryContext(ctx, query)); err != nil {
			t.Errorf("the same statement on a new connection = %v, want it to run", err)
		}

		if _, err := sqldb.ExecContext(ctx, `CREATE TABLE notes (body text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		_, err = sqldb.ExecContext(ctx, `INSERT INTO notes SELECT string_agg(md5(i::text), '') FROM generate_series(1, 200) AS i`)
		if got := idempgsql.SQLState(err); got != "54000" {
			t.Fatalf("an index row over the limit = %v (SQLSTATE %q), want 54000", err, got)
		}
		if got := idempgsql.Classify(err); got != idem.ClassPermanent {
			t.Errorf("an index row over PostgreSQL's limit: Classify(%v) = %v, want permanent", err, got)
		}
	})
}

// openSQLOn is a second *sql.DB of driver on the schema of db's
// connections, with connections of its own.
func openSQLOn(t *testing.T, driver string, db *sql.DB) *sql.DB {
	t.Helper()
	var schema string
	if err := db.QueryRowContext(t.Context(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open(driver, withParam(pgURL(t), "search_path="+schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	return other
}
