package idempg

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// MessagesComponent is the component under which NewInbox, NewOutbox,
// NewDeadLetters and NewLedger record their schema migrations in
// idem_schema_migrations. They share one set of tables, so any of them
// creates every message table.
const MessagesComponent = pgsql.MessagesComponent

// migrateMessages applies the message tables' migrations to db.
func migrateMessages(ctx context.Context, db *DB) error {
	if db == nil {
		return &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	return db.Migrate(ctx, MessagesComponent, pgsql.Messages)
}

// msgQuerier is what the message stores' statements run on: the pool, or
// the transaction a context carries.
type msgQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// writeQuerier returns what a write runs on: the transaction ctx carries
// (which begins with the statement if it has not begun), or the pool, where
// a single statement commits on its own.
func (db *DB) writeQuerier(ctx context.Context) (msgQuerier, error) {
	if st := db.carried(ctx); st != nil {
		if st.isEnded() {
			return nil, &txError{"begin", errTxEnded}
		}
		return st.tx, nil
	}
	return db.pool, nil
}

// readQuerier returns what a read runs on: the transaction ctx carries when
// it has begun, so that the read sees its writes, or else the pool, so that
// a read does not begin a transaction that has written nothing.
func (db *DB) readQuerier(ctx context.Context) msgQuerier {
	if st := db.carried(ctx); st != nil {
		if tx := st.begun(); tx != nil {
			return tx
		}
	}
	return db.pool
}

// storeNow is the time parameter of a statement of a message store: the
// store's own clock when it has one, else the DB's (see DB.now).
func (db *DB) storeNow(c idem.Clock) any {
	if c != nil {
		return c.Now()
	}
	return db.now()
}

// freeText makes s storable as text: bytes that are not UTF-8, and NUL
// bytes, which PostgreSQL's text cannot hold, become U+FFFD. It is used for
// what people read (error texts, reasons), which must be recorded whatever
// they hold rather than refused.
func freeText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
