package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

//go:embed messagemigrations/*.sql
var messageMigrationFiles embed.FS

// MessagesComponent is the component under which NewInbox, NewOutbox,
// NewDeadLetters, NewLedger and NewTransport record their schema
// migrations in idem_schema_migrations. They share one schema, so any of
// them creates every message table.
const MessagesComponent = "idem_messages"

// migrateMessages applies the message tables' migrations to db.
func migrateMessages(ctx context.Context, db *DB) error {
	if db == nil {
		return &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	sub, err := fs.Sub(messageMigrationFiles, "messagemigrations")
	if err != nil {
		return fmt.Errorf("idemsqlite: %w", err)
	}
	if err := db.Migrate(ctx, MessagesComponent, sub); err != nil {
		return err
	}
	return db.prepare(ctx, MessagesComponent)
}

// queryer is what both *sql.Tx and *sql.DB offer.
type queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// read runs fn on the transaction ctx carries, so that a read sees that
// transaction's own writes, or else on the read pool, which does not wait
// for the writer.
func (db *DB) read(ctx context.Context, fn func(ctx context.Context, r runner) error) error {
	if db.carried(ctx) != nil {
		return db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, db.in(tx)) })
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn(ctx, db.onReader())
}

// msgNanos stores t; a zero time is stored as 0.
func msgNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// msgTime reads what msgNanos stored.
func msgTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// encodeHeaders stores h as a JSON object, or NULL when it is empty. JSON
// strings cannot carry bytes that are not UTF-8, and encoding/json would
// replace them; so when a key or value is not valid UTF-8, every key and
// value is base64-encoded instead and the object is prefixed with
// base64Headers, which no JSON text begins with. Headers come back byte for
// byte either way.
func encodeHeaders(h map[string]string) (any, error) {
	if len(h) == 0 {
		return nil, nil
	}
	prefix, enc := "", h
	for k, v := range h {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			prefix, enc = base64Headers, make(map[string]string, len(h))
			for k, v := range h {
				enc[base64.StdEncoding.EncodeToString([]byte(k))] = base64.StdEncoding.EncodeToString([]byte(v))
			}
			break
		}
	}
	b, err := json.Marshal(enc)
	if err != nil {
		return nil, fmt.Errorf("encoding headers: %w", err)
	}
	return prefix + string(b), nil
}

const base64Headers = "base64:"

// decodeHeaders reads what encodeHeaders stored.
func decodeHeaders(s sql.NullString) (map[string]string, error) {
	if !s.Valid || s.String == "" {
		return nil, nil
	}
	text, encoded := strings.CutPrefix(s.String, base64Headers)
	var h map[string]string
	if err := json.Unmarshal([]byte(text), &h); err != nil {
		return nil, fmt.Errorf("decoding headers: %w", err)
	}
	if !encoded {
		return h, nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		dk, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return nil, fmt.Errorf("decoding headers: %w", err)
		}
		dv, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("decoding headers: %w", err)
		}
		out[string(dk)] = string(dv)
	}
	return out, nil
}

// payloadArg stores p, keeping an empty payload distinct from none only as
// far as bytes go: both come back empty.
func payloadArg(p []byte) any {
	if p == nil {
		return []byte{}
	}
	return p
}

// wrapTx prefixes the package's own errors (a failure to begin or commit)
// with op, and returns other errors, the caller's, unchanged.
func wrapTx(op string, err error) error {
	if te, ok := err.(*txError); ok {
		return fmt.Errorf("idemsqlite: %s: %w", op, te)
	}
	return err
}
