package idempg

import (
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
)

//go:embed messagemigrations/*.sql
var messageMigrationFiles embed.FS

// MessagesComponent is the component under which NewInbox, NewOutbox,
// NewDeadLetters and NewLedger record their schema migrations in
// idem_schema_migrations. They share one set of tables, so any of them
// creates every message table.
const MessagesComponent = "idem_messages"

// migrateMessages applies the message tables' migrations to db.
func migrateMessages(ctx context.Context, db *DB) error {
	if db == nil {
		return &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	sub, err := fs.Sub(messageMigrationFiles, "messagemigrations")
	if err != nil {
		return fmt.Errorf("idempg: %w", err)
	}
	return db.Migrate(ctx, MessagesComponent, sub)
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

// timeArg stores t; a zero time is stored as NULL.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// timeOf reads what timeArg stored, in UTC.
func timeOf(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// checkMessage refuses a message that cannot be published, or whose ID,
// topic or key PostgreSQL's text type cannot hold.
func checkMessage(m idem.Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"Message.ID", m.ID}, {"Message.Topic", m.Topic}, {"Message.Key", m.Key},
	} {
		if err := checkText(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

// checkName refuses an empty name, or one PostgreSQL's text type cannot
// hold.
func checkName(field, s string) error {
	if s == "" {
		return &idem.ArgumentError{Field: field, Reason: "must not be empty"}
	}
	return checkText(field, s)
}

// freeText makes s storable as text: bytes that are not UTF-8, and NUL
// bytes, which PostgreSQL's text cannot hold, become U+FFFD. It is used for
// what people read (error texts, reasons), which must be recorded whatever
// they hold rather than refused.
func freeText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// headersArg stores h: the text of a JSON object, or nil (NULL) when h is
// empty, and whether its keys and values are base64-encoded. jsonb holds
// only valid UTF-8 and no NUL character, so when any key or value breaks
// either rule, every key and value is encoded; headers come back byte for
// byte either way.
func headersArg(h map[string]string) (headers *string, encoded bool, err error) {
	if len(h) == 0 {
		return nil, false, nil
	}
	enc := h
	for k, v := range h {
		if jsonbSafe(k) && jsonbSafe(v) {
			continue
		}
		encoded, enc = true, make(map[string]string, len(h))
		for k, v := range h {
			enc[base64.StdEncoding.EncodeToString([]byte(k))] = base64.StdEncoding.EncodeToString([]byte(v))
		}
		break
	}
	b, err := json.Marshal(enc)
	if err != nil {
		return nil, false, fmt.Errorf("encoding headers: %w", err)
	}
	text := string(b)
	return &text, encoded, nil
}

func jsonbSafe(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// headersOf reads what headersArg stored.
func headersOf(b []byte, encoded bool) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
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

// payloadArg stores p; a nil payload is stored empty.
func payloadArg(p []byte) []byte {
	if p == nil {
		return []byte{}
	}
	return p
}

// messageRow is a message as the message tables store it.
type messageRow struct {
	id, topic, key string
	headers        []byte
	encoded        bool
	payload        []byte
	msgTime        *time.Time
}

// dest returns the scan destinations of messageColumns.
func (r *messageRow) dest() []any {
	return []any{&r.id, &r.topic, &r.key, &r.headers, &r.encoded, &r.payload, &r.msgTime}
}

// messageColumns are the columns that messageRow.dest scans, for a table
// whose message ID column is id.
const messageColumns = `id, topic, key, headers, headers_base64, payload, msg_time`

func (r *messageRow) message() (idem.Message, error) {
	h, err := headersOf(r.headers, r.encoded)
	if err != nil {
		return idem.Message{}, err
	}
	return idem.Message{ID: r.id, Topic: r.topic, Key: r.key, Headers: h, Payload: r.payload, Time: timeOf(r.msgTime)}, nil
}

// messageArgs are a message's column values, in messageColumns' order.
// Statements cast the headers' parameter ($n::text::jsonb): it is JSON
// text.
func messageArgs(m idem.Message) ([]any, error) {
	h, encoded, err := headersArg(m.Headers)
	if err != nil {
		return nil, err
	}
	return []any{m.ID, m.Topic, m.Key, h, encoded, payloadArg(m.Payload), timeArg(m.Time)}, nil
}
