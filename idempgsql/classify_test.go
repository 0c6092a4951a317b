package idempgsql_test

import (
	"context"
	"errors"
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
