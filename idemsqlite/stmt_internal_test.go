package idemsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// components builds every component on db.
type components struct {
	store   *Store
	inbox   *Inbox
	outbox  *Outbox
	ledger  *Ledger
	letters *DeadLetters
	tr      *Transport
}

func newComponents(t *testing.T, db *DB) components {
	t.Helper()
	ctx := t.Context()
	var c components
	var err error
	if c.store, err = NewStore(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if c.inbox, err = NewInbox(ctx, db); err != nil {
		t.Fatal(err)
	}
	if c.outbox, err = NewOutbox(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if c.ledger, err = NewLedger(ctx, db); err != nil {
		t.Fatal(err)
	}
	if c.letters, err = NewDeadLetters(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if c.tr, err = NewTransport(ctx, db, &TransportConfig{Poll: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.tr.Close() })
	return c
}

// cached returns the writer's prepared statements, by statement.
func cached(db *DB) map[*statement]*sql.Stmt {
	out := make(map[*statement]*sql.Stmt)
	db.stmts.writer.Range(func(k, v any) bool {
		out[k.(*statement)] = v.(*sql.Stmt)
		return true
	})
	return out
}

// The constructors prepare every statement once per DB, however many
// components are built; the hot paths run the prepared copies, also after
// the writer's connection was replaced; Close closes them.
func TestStatementsPreparedOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := newComponents(t, db)
	first := cached(db)
	for component, list := range statements {
		for _, s := range list {
			if first[s] == nil {
				t.Errorf("%s: %s is not prepared", component, abbreviate(s.sql))
			}
		}
	}
	newComponents(t, db)
	again := cached(db)
	if len(again) != len(first) {
		t.Errorf("%d statements prepared after building the components twice, want %d", len(again), len(first))
	}
	for s, p := range first {
		if again[s] != p {
			t.Errorf("%s was prepared again", abbreviate(s.sql))
		}
	}

	exercise(t, c)
	// A connection that fails is dropped by database/sql, and the next
	// transaction runs on a new one, where the statements are prepared
	// again.
	for _, pool := range []*sql.DB{db.writer, db.reader} {
		conn, err := pool.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
	}
	exercise(t, c)
	if n := db.stmts.unprepared.Load(); n != 0 {
		t.Errorf("%d statements ran unprepared", n)
	}

	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for s, p := range first {
		if _, err := p.Exec(); err == nil {
			t.Errorf("%s still runs after Close", abbreviate(s.sql))
		}
		break
	}
	if _, err := c.store.Claim(ctx, idem.ClaimRequest{Key: "k", Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour}); err == nil {
		t.Error("Claim after the DB's Close succeeded")
	}
}

// exercise runs every method of the components that has a statement.
func exercise(t *testing.T, c components) {
	t.Helper()
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	key := idem.Key(uniqueKey())
	req := idem.ClaimRequest{Key: key, Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour}
	cl, err := c.store.Claim(ctx, req)
	must(err)
	must(c.store.Complete(ctx, idem.Ref{Key: key, Token: cl.Token}, idem.Response{Status: 201}))
	if _, err := c.store.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.store.Get(ctx, "", key); err != nil {
		t.Fatal(err)
	}
	other := req
	other.Key += "-2"
	cl, err = c.store.Claim(ctx, other)
	must(err)
	if err := c.store.Release(ctx, idem.Ref{Key: other.Key, Token: cl.Token + 1}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Release with a wrong token = %v", err)
	}
	must(c.store.Release(ctx, idem.Ref{Key: other.Key, Token: cl.Token}))
	_, err = c.store.Purge(ctx, 10)
	must(err)

	must(c.inbox.Process(ctx, "c", string(key), func(context.Context) error { return nil }))
	must(c.inbox.ProcessBatch(ctx, "c", []string{string(key), string(key) + "-2"}, func(context.Context, []bool) error { return nil }))
	_, err = c.inbox.PurgeInbox(ctx, time.Unix(0, 1), 10)
	must(err)

	_, err = c.ledger.RecordAttempt(ctx, "c", string(key), idem.Attempt{Number: 1, Class: idem.ClassTransient, Error: "x"})
	must(err)
	_, err = c.ledger.Attempts(ctx, "c", string(key))
	must(err)
	must(c.ledger.ForgetAttempts(ctx, "c", string(key)))
	must(c.ledger.HoldBack(ctx, "c", "acct", "dl"))
	_, _, err = c.ledger.HeldBack(ctx, "c", "acct")
	must(err)
	_, err = c.ledger.HeldBackKeys(ctx, "c", []string{"acct", "other"})
	must(err)
	must(c.ledger.Park(ctx, "c", idem.Message{ID: string(key), Topic: "t", Key: "acct"}))
	_, err = c.ledger.LetGo(ctx, "c", "acct")
	must(err)

	id, err := c.letters.Add(ctx, idem.DeadLetter{
		Consumer: "c", Class: idem.DeadPermanent, Message: idem.Message{ID: string(key), Topic: "t"},
		Attempts: []idem.Attempt{{Number: 1, Class: idem.ClassPermanent, Error: "bad"}},
	})
	must(err)
	_, err = c.letters.Get(ctx, id)
	must(err)
	_, err = c.letters.Resolve(ctx, id, idem.LetterDiscarded, idem.LetterEvent{Actor: "me"})
	must(err)
	_, err = c.letters.Stats(ctx)
	must(err)

	topic := "t-" + string(key)
	s, err := c.tr.Subscribe(ctx, idem.Subscription{Topic: topic, Consumer: "c"})
	must(err)
	defer s.Close()
	must(c.tr.Publish(ctx, idem.Message{ID: "1", Topic: topic}, idem.Message{ID: "2", Topic: topic}))
	must(c.outbox.Add(ctx, idem.Message{ID: "3", Topic: topic}, idem.Message{ID: "4", Topic: topic}, idem.Message{ID: "5", Topic: topic}))
	entries, err := c.outbox.Claim(ctx, "relay", 1, time.Minute)
	must(err)
	must(c.outbox.MarkSent(ctx, entries[0].Seq))
	if _, _, err := c.tr.MoveOutbox(ctx, c.outbox, 10); err != nil {
		t.Fatal(err)
	}
	bs := s.(idem.BatchStream)
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := s.Next(wait)
	must(err)
	must(d.InProgress(ctx))
	must(d.Nack(ctx, 0))
	var ds []idem.Delivery
	for len(ds) < 4 {
		more, err := bs.NextBatch(wait, 10)
		must(err)
		ds = append(ds, more...)
	}
	must(ds[0].Term(ctx))
	must(ds[1].Ack(ctx))
	if n, err := bs.AckBatch(ctx, ds[2:]); err != nil || n != 2 {
		t.Fatalf("AckBatch = %d, %v", n, err)
	}
	_, err = c.tr.Purge(ctx, time.Now().Add(time.Hour), 10)
	must(err)
}

var keys atomic.Int64

// uniqueKey returns a key no earlier call returned.
func uniqueKey() string { return fmt.Sprint("k-", keys.Add(1)) }
