package ormtest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// gormORM is GORM on the application's *sql.DB (postgres.Config.Conn), so
// that it runs on whichever driver opened it.
type gormORM struct{ db *gorm.DB }

func newGORM(t *testing.T, e *env) orm {
	t.Helper()
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: e.sql}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return gormORM{db}
}

func (g gormORM) name() string { return "GORM" }

// inTx is GORM's Transaction.
func (g gormORM) inTx(ctx context.Context, fn func(w writer) error) error {
	return g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return fn(gormWriter{tx}) })
}

// on is GORM in a transaction idem handed out (DB.WithTx): a session whose
// connection is that *sql.Tx, as GORM's own Begin makes one on the
// *sql.Tx it begins.
func (g gormORM) on(ctx context.Context, tx *sql.Tx) writer {
	s := g.db.Session(&gorm.Session{Context: ctx, NewDB: true})
	s.Statement.ConnPool = tx
	return gormWriter{s}
}

type gormWriter struct{ tx *gorm.DB }

func (w gormWriter) sqlTx() *sql.Tx {
	tx, ok := w.tx.Statement.ConnPool.(*sql.Tx)
	if !ok {
		panic(fmt.Sprintf("GORM's connection in a transaction is a %T, not a *sql.Tx", w.tx.Statement.ConnPool))
	}
	return tx
}

func (w gormWriter) add(ctx context.Context, amount int64) error {
	return w.tx.WithContext(ctx).Exec(addSQL, amount).Error
}

func (w gormWriter) createOrder(ctx context.Context, id, item string) error {
	return w.tx.WithContext(ctx).Create(&Order{ID: id, Item: item}).Error
}

// nested is GORM's nested Transaction: a savepoint, rolled back when fn
// fails.
func (w gormWriter) nested(ctx context.Context, fn func(w writer) error) error {
	return w.tx.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return fn(gormWriter{tx}) })
}

func TestGORM(t *testing.T) {
	t.Parallel()
	runSuite(t, newGORM)
}
