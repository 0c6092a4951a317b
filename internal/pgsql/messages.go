package pgsql

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// CheckMessage refuses a message that cannot be published, or whose ID,
// topic or key PostgreSQL's text type cannot hold.
func CheckMessage(m idem.Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"Message.ID", m.ID}, {"Message.Topic", m.Topic}, {"Message.Key", m.Key},
	} {
		if err := CheckText(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

// CheckName refuses an empty name, or one PostgreSQL's text type cannot
// hold.
func CheckName(field, s string) error {
	if s == "" {
		return &idem.ArgumentError{Field: field, Reason: "must not be empty"}
	}
	return CheckText(field, s)
}

// HeadersArg stores h: the text of a JSON object, or nil (NULL) when h is
// empty, and whether its keys and values are base64-encoded. jsonb holds
// only valid UTF-8 and no NUL character, so when any key or value breaks
// either rule, every key and value is encoded; headers come back byte for
// byte either way.
func HeadersArg(h map[string]string) (headers *string, encoded bool, err error) {
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

// HeadersOf reads what HeadersArg stored.
func HeadersOf(b []byte, encoded bool) (map[string]string, error) {
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

// PayloadArg stores p; a nil payload is stored empty.
func PayloadArg(p []byte) []byte {
	if p == nil {
		return []byte{}
	}
	return p
}

// MessageRow is a message as the message tables store it.
type MessageRow struct {
	id, topic, key string
	headers        []byte
	encoded        bool
	payload        []byte
	msgTime        *time.Time
}

// dest returns the scan destinations of MessageColumns.
func (r *MessageRow) Dest() []any {
	return []any{&r.id, &r.topic, &r.key, &r.headers, &r.encoded, &r.payload, &r.msgTime}
}

// MessageColumns are the columns that MessageRow.dest scans, for a table
// whose message ID column is id.
const MessageColumns = `id, topic, key, headers, headers_base64, payload, msg_time`

func (r *MessageRow) Message() (idem.Message, error) {
	h, err := HeadersOf(r.headers, r.encoded)
	if err != nil {
		return idem.Message{}, err
	}
	return idem.Message{ID: r.id, Topic: r.topic, Key: r.key, Headers: h, Payload: r.payload, Time: TimeOf(r.msgTime)}, nil
}

// MessageArgs are a message's column values, in MessageColumns' order.
// Statements cast the headers' parameter ($n::text::jsonb): it is JSON
// text.
func MessageArgs(m idem.Message) ([]any, error) {
	h, encoded, err := HeadersArg(m.Headers)
	if err != nil {
		return nil, err
	}
	return []any{m.ID, m.Topic, m.Key, h, encoded, PayloadArg(m.Payload), TimeArg(m.Time)}, nil
}

// TimeArg stores t; a zero time is stored as NULL.
func TimeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// TimeOf reads what TimeArg stored, in UTC.
func TimeOf(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// InboxInsert records a message. Under READ COMMITTED (or any level),
// ON CONFLICT waits for a concurrent transaction that inserted the same
// pair: when that one commits, this one inserts nothing (a duplicate);
// when it rolls back, this one inserts. Its command tag counts the rows
// inserted.
const InboxInsert = `INSERT INTO idem_inbox (consumer, dedup_key, processed_at)
	VALUES ($1, $2, coalesce($3::timestamptz, clock_timestamp()))
	ON CONFLICT (consumer, dedup_key) DO NOTHING`

// PurgeInbox deletes up to $2 rows recorded before $1, oldest first,
// through the processed_at index. Rows that another transaction holds (a
// delivery of the same message in flight) are skipped, not waited for.
const PurgeInbox = `DELETE FROM idem_inbox AS i
	WHERE (i.consumer, i.dedup_key) IN (
		SELECT consumer, dedup_key FROM idem_inbox
		WHERE processed_at < $1
		ORDER BY processed_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED)`

// OutboxAddOne is outboxAddSQL for one message: a single-row INSERT,
// which PostgreSQL plans and runs for less than the unnest of seven arrays,
// and whose arguments pgx encodes without building arrays. An effect's
// transaction usually announces one event.
const OutboxAddOne = `INSERT INTO idem_outbox (` + MessageColumns + `, created_at)
	VALUES ($1, $2, $3, $4::text::jsonb, $5, $6, $7, coalesce($8::timestamptz, clock_timestamp()))`

// OutboxClaim leases up to $2 entries whose lease has ended (or that
// never had one), oldest first. FOR UPDATE SKIP LOCKED passes over the rows
// that a concurrent Claim is leasing, instead of waiting for it: concurrent
// relays lease disjoint entries and never queue behind one another. A row
// found unlocked is locked and its lease checked again on its newest
// version, so an entry that another relay leased and committed meanwhile is
// not taken.
const OutboxClaim = `WITH n AS MATERIALIZED (SELECT coalesce($1::timestamptz, clock_timestamp()) AS t),
picked AS (
	SELECT o.seq FROM idem_outbox AS o, n
	WHERE o.lease_until IS NULL OR o.lease_until <= n.t
	ORDER BY o.seq
	LIMIT $2
	FOR UPDATE OF o SKIP LOCKED)
UPDATE idem_outbox AS o SET relay = $3, lease_until = n.t + $4::bigint * interval '1 microsecond'
FROM picked, n
WHERE o.seq = picked.seq
RETURNING o.seq, o.id, o.topic, o.key, o.headers, o.headers_base64, o.payload, o.msg_time, o.created_at`
