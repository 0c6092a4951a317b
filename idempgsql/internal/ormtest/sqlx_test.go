package ormtest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jmoiron/sqlx"
)

// sqlxORM is sqlx on the application's *sql.DB.
type sqlxORM struct{ db *sqlx.DB }

func newSQLX(t *testing.T, e *env) orm {
	return sqlxORM{sqlx.NewDb(e.sql, e.driver)}
}

func (s sqlxORM) name() string { return "sqlx" }

// inTx is a transaction begun with BeginTxx, committed when fn returns
// nil, as an sqlx application writes it.
func (s sqlxORM) inTx(ctx context.Context, fn func(w writer) error) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(sqlxWriter{tx}); err != nil {
		return err
	}
	return tx.Commit()
}

// on is sqlx in a transaction idem handed out (DB.WithTx).
func (s sqlxORM) on(_ context.Context, tx *sql.Tx) writer {
	return sqlxWriter{&sqlx.Tx{Tx: tx, Mapper: s.db.Mapper}}
}

type sqlxWriter struct{ tx *sqlx.Tx }

func (w sqlxWriter) sqlTx() *sql.Tx { return w.tx.Tx }

func (w sqlxWriter) add(ctx context.Context, amount int64) error {
	_, err := w.tx.ExecContext(ctx, addSQL, amount)
	return err
}

func (w sqlxWriter) createOrder(ctx context.Context, id, item string) error {
	_, err := w.tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ($1, $2)`, id, item)
	if err != nil {
		return err
	}
	// Read back through sqlx's mapping, as an sqlx application would.
	var o Order
	return w.tx.GetContext(ctx, &o, `SELECT id, item FROM orders WHERE id = $1`, id)
}

// nested is a savepoint of the application's own (sqlx has no nested
// transactions): rolled back to when fn fails.
func (w sqlxWriter) nested(ctx context.Context, fn func(w writer) error) error {
	if _, err := w.tx.ExecContext(ctx, `SAVEPOINT app_nested`); err != nil {
		return err
	}
	if err := fn(w); err != nil {
		if _, rerr := w.tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT app_nested`); rerr != nil {
			return rerr
		}
		return err
	}
	_, err := w.tx.ExecContext(ctx, `RELEASE SAVEPOINT app_nested`)
	return err
}

func TestSQLX(t *testing.T) {
	t.Parallel()
	runSuite(t, newSQLX)
}
