package idemsqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// moveEnv is a Transport and an Outbox on one DB, on one manual clock.
type moveEnv struct {
	t     *testing.T
	ctx   context.Context
	db    *idemsqlite.DB
	clock *idemmem.Clock
	tr    *idemsqlite.Transport
	ob    *idemsqlite.Outbox
}

func newMoveEnv(t *testing.T) *moveEnv {
	t.Helper()
	db := openMessagesDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	ob, err := idemsqlite.NewOutbox(t.Context(), db, &idemsqlite.OutboxConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return &moveEnv{t: t, ctx: t.Context(), db: db, clock: clock, tr: newTransport(t, db, clock), ob: ob}
}

func (e *moveEnv) add(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		if err := e.ob.Add(e.ctx, idem.Message{ID: id, Topic: "payments", Payload: []byte(id)}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *moveEnv) move(limit, want int) {
	e.t.Helper()
	n, ok, err := e.tr.MoveOutbox(e.ctx, e.ob, limit)
	if err != nil || !ok || n != want {
		e.t.Fatalf("MoveOutbox(%d) = %d, %v, %v; want %d, true, nil", limit, n, ok, err, want)
	}
}

// logged returns the IDs of the messages in the transport's log, in order.
func (e *moveEnv) logged() []string {
	e.t.Helper()
	rows, err := e.db.Reader().QueryContext(e.ctx, `SELECT id FROM idem_transport_messages ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// unsent returns the IDs of the outbox's entries, in order.
func (e *moveEnv) unsent() []string {
	e.t.Helper()
	rows, err := e.db.Reader().QueryContext(e.ctx, `SELECT id FROM idem_outbox ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// received takes n messages from s and returns their IDs in order.
func received(t *testing.T, s idem.Stream, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		d := next(t, s)
		ids = append(ids, d.Message().ID)
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return out
}

func TestMoveOutboxOrder(t *testing.T) {
	t.Parallel()
	e := newMoveEnv(t)
	s, err := e.tr.Subscribe(e.ctx, idem.Subscription{Topic: "payments", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all := ids("m", 10)
	e.add(all...)
	e.move(4, 4)
	if got := e.unsent(); !slices.Equal(got, all[4:]) {
		t.Errorf("outbox after moving 4 = %v, want %v", got, all[4:])
	}
	e.move(100, 6)
	e.move(100, 0)
	if got := e.logged(); !slices.Equal(got, all) {
		t.Errorf("log = %v, want %v, in the outbox's order", got, all)
	}
	if got := received(t, s, len(all)); !slices.Equal(got, all) {
		t.Errorf("received %v, want %v", got, all)
	}
	if got, err := e.ob.Claim(e.ctx, "relay", 100, time.Minute); err != nil || len(got) != 0 {
		t.Errorf("Claim after moving everything = %d entries, %v; want none", len(got), err)
	}
}

// Entries a relay holds under a live lease stay where they are until the
// lease ends; then they are moved, after the ones moved meanwhile.
func TestMoveOutboxRespectsLeases(t *testing.T) {
	t.Parallel()
	e := newMoveEnv(t)
	all := ids("m", 6)
	e.add(all...)
	claimed, err := e.ob.Claim(e.ctx, "relay", 2, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("Claim = %d entries, %v", len(claimed), err)
	}
	e.move(10, 4)
	if got := e.unsent(); !slices.Equal(got, all[:2]) {
		t.Errorf("outbox = %v, want the leased %v", got, all[:2])
	}
	e.clock.Advance(time.Minute - time.Nanosecond)
	e.move(10, 0)
	e.clock.Advance(time.Nanosecond)
	e.move(10, 2)
	if got, want := e.logged(), append(slices.Clone(all[2:]), all[:2]...); !slices.Equal(got, want) {
		t.Errorf("log = %v, want %v", got, want)
	}
}

// MoveOutbox takes only an Outbox of its own DB, and refuses an invalid
// limit.
func TestMoveOutboxOtherOutboxes(t *testing.T) {
	t.Parallel()
	e := newMoveEnv(t)
	e.add("m-1")
	elsewhere, err := idemsqlite.NewOutbox(e.ctx, openMessagesDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := elsewhere.Add(e.ctx, idem.Message{ID: "other-1", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	// Another DB on the same file is another DB: its transactions are not
	// the Transport's.
	sameFile, err := idemsqlite.Open(e.db.Path(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sameFile.Close()
	sameFileOutbox, err := idemsqlite.NewOutbox(e.ctx, sameFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	mem := idemmem.NewOutbox(nil)
	if err := mem.Add(e.ctx, idem.Message{ID: "mem-1", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	var nilOutbox *idemsqlite.Outbox
	for name, ob := range map[string]idem.Outbox{
		"another DB's":            elsewhere,
		"another DB's, same file": sameFileOutbox,
		"idemmem's":               mem,
		"a nil *Outbox":           nilOutbox,
		"nil":                     nil,
	} {
		if n, ok, err := e.tr.MoveOutbox(e.ctx, ob, 10); n != 0 || ok || err != nil {
			t.Errorf("MoveOutbox(%s outbox) = %d, %v, %v; want 0, false, nil", name, n, ok, err)
		}
	}
	if got := e.logged(); len(got) != 0 {
		t.Errorf("log = %v after moving from other outboxes, want nothing", got)
	}
	if got, err := mem.Claim(e.ctx, "relay", 10, time.Minute); err != nil || len(got) != 1 {
		t.Errorf("idemmem outbox after MoveOutbox: Claim = %d entries, %v; want its entry untouched", len(got), err)
	}
	for _, limit := range []int{0, -1} {
		if _, ok, err := e.tr.MoveOutbox(e.ctx, e.ob, limit); !errors.Is(err, idem.ErrInvalidArgument) || !ok {
			t.Errorf("MoveOutbox(limit %d) = ok %v, %v; want ok and idem.ErrInvalidArgument", limit, ok, err)
		}
		if _, _, err := e.tr.MoveOutbox(e.ctx, mem, limit); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("MoveOutbox(idemmem outbox, limit %d) = %v; want idem.ErrInvalidArgument", limit, err)
		}
	}
	if got := e.unsent(); !slices.Equal(got, []string{"m-1"}) {
		t.Errorf("outbox = %v, want its entry untouched", got)
	}
	if err := e.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.tr.MoveOutbox(e.ctx, e.ob, 10); !errors.Is(err, idem.ErrClosed) || !ok {
		t.Errorf("MoveOutbox after Close = ok %v, %v; want ok and idem.ErrClosed", ok, err)
	}
}

// MoveOutbox joins the transaction ctx carries: rolled back with it, it
// moved nothing; committed with it, it moved the entries.
func TestMoveOutboxInCallersTx(t *testing.T) {
	t.Parallel()
	e := newMoveEnv(t)
	all := ids("m", 3)
	e.add(all...)
	rollback := errors.New("roll back")
	err := e.db.WithTx(e.ctx, func(ctx context.Context, _ *sql.Tx) error {
		n, ok, err := e.tr.MoveOutbox(ctx, e.ob, 10)
		if err != nil || !ok || n != 3 {
			t.Errorf("MoveOutbox in the transaction = %d, %v, %v", n, ok, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if got := e.logged(); len(got) != 0 {
		t.Errorf("log = %v after a rolled-back move, want nothing", got)
	}
	if got := e.unsent(); !slices.Equal(got, all) {
		t.Errorf("outbox = %v after a rolled-back move, want %v", got, all)
	}
	// A move that fails half-way rolls back its own transaction too: here
	// its context ends before it starts.
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, _, err := e.tr.MoveOutbox(cancelled, e.ob, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("MoveOutbox(cancelled context) = %v, want context.Canceled", err)
	}
	err = e.db.WithTx(e.ctx, func(ctx context.Context, _ *sql.Tx) error {
		_, _, err := e.tr.MoveOutbox(ctx, e.ob, 10)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.logged(); !slices.Equal(got, all) {
		t.Errorf("log = %v after a committed move, want %v", got, all)
	}
	if got := e.unsent(); len(got) != 0 {
		t.Errorf("outbox = %v after a committed move, want it empty", got)
	}
}

// A move whose transaction fails half-way moves nothing: here a trigger
// refuses the deletion from the outbox, after the copy into the log.
func TestMoveOutboxFailureMovesNothing(t *testing.T) {
	t.Parallel()
	e := newMoveEnv(t)
	all := ids("m", 3)
	e.add(all...)
	if _, err := e.db.Writer().ExecContext(e.ctx, `CREATE TRIGGER refuse_sent BEFORE DELETE ON idem_outbox
		BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	if n, ok, err := e.tr.MoveOutbox(e.ctx, e.ob, 10); err == nil || !strings.Contains(err.Error(), "refused") || !ok || n != 0 {
		t.Fatalf("MoveOutbox with the deletion refused = %d, %v, %v; want 0, true and the trigger's error", n, ok, err)
	}
	if got := e.logged(); len(got) != 0 {
		t.Errorf("log = %v after a failed move, want nothing", got)
	}
	if got := e.unsent(); !slices.Equal(got, all) {
		t.Errorf("outbox = %v after a failed move, want %v", got, all)
	}
	if _, err := e.db.Writer().ExecContext(e.ctx, `DROP TRIGGER refuse_sent`); err != nil {
		t.Fatal(err)
	}
	e.move(10, 3)
}

// A stream waiting for a message is woken by the move, as by a Publish:
// its poll is far longer than the test may take.
func TestMoveOutboxWakesStreams(t *testing.T) {
	t.Parallel()
	e := newMoveEnv(t)
	tr, err := idemsqlite.NewTransport(e.ctx, e.db, &idemsqlite.TransportConfig{Clock: e.clock, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	s, err := tr.Subscribe(e.ctx, idem.Subscription{Topic: "payments", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		defer cancel()
		d, err := s.Next(ctx)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- d.Message().ID
	}()
	e.add("m-1")
	if n, _, err := tr.MoveOutbox(e.ctx, e.ob, 10); err != nil || n != 1 {
		t.Fatalf("MoveOutbox = %d, %v", n, err)
	}
	if id := <-got; id != "m-1" {
		t.Errorf("Next = %s, want m-1", id)
	}
}

// A moved message is stored byte for byte as Publish stores it, and comes
// out of a stream as it went into the outbox.
func TestMoveOutboxByteExact(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	msgs := []idem.Message{
		{ID: "text", Topic: "payments", Key: "acct-1", Payload: []byte(`{"amount":1250}`),
			Headers: map[string]string{"Content-Type": "application/json", "X-Unicode": "ünïcødé ✓", "X-Empty": ""}, Time: at},
		{ID: "bytes", Topic: "payments", Key: "acct-\xff", Payload: []byte{0, 0xff, 0xfe, 'a', 0},
			Headers: map[string]string{"X-Raw": "\xff\x00\xfe"}},
		{ID: "empty", Topic: "payments", Payload: []byte{}},
		{ID: "none", Topic: "payments"},
		{ID: "\xc3 id", Topic: "payments.other", Time: time.Unix(0, 1)},
	}
	// The same messages through Publish, on a DB of their own, on a clock
	// showing the same time.
	published := openMessagesDB(t)
	pubClock := idemmem.NewClock(idemtest.Start)
	if err := newTransport(t, published, pubClock).Publish(t.Context(), msgs...); err != nil {
		t.Fatal(err)
	}
	e := newMoveEnv(t)
	s, err := e.tr.Subscribe(e.ctx, idem.Subscription{Topic: "payments", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := e.ob.Add(e.ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	e.move(10, len(msgs))

	if got, want := storedLog(t, e.db), storedLog(t, published); !slices.Equal(got, want) {
		t.Errorf("moved messages stored as\n%s\nPublish stores them as\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	bs := s.(idem.BatchStream)
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	var ds []idem.Delivery
	for len(ds) < len(msgs)-1 {
		more, err := bs.NextBatch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, more...)
	}
	for i, d := range ds {
		want := msgs[i]
		if want.Time.IsZero() {
			want.Time = idemtest.Start
		}
		got := d.Message()
		if got.ID != want.ID || got.Topic != want.Topic || got.Key != want.Key || !bytes.Equal(got.Payload, want.Payload) ||
			!maps.Equal(got.Headers, want.Headers) || !got.Time.Equal(want.Time) {
			t.Errorf("delivery %d = %+v, want %+v", i, got, want)
		}
	}
	if n, err := bs.AckBatch(e.ctx, ds); err != nil || n != len(ds) {
		t.Errorf("AckBatch = %d, %v", n, err)
	}
}

// storedLog returns the transport's log as stored: each column's type and
// value, quoted by SQLite, so that text and blobs compare byte for byte.
func storedLog(t *testing.T, db *idemsqlite.DB) []string {
	t.Helper()
	rows, err := db.Reader().QueryContext(t.Context(), `SELECT
		typeof(topic) || ' ' || quote(topic), typeof(id) || ' ' || quote(CAST(id AS BLOB)),
		typeof(key) || ' ' || quote(CAST(key AS BLOB)), typeof(headers) || ' ' || quote(CAST(headers AS BLOB)),
		typeof(payload) || ' ' || quote(payload), quote(msg_time), quote(published_at)
		FROM idem_transport_messages ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		cols := make([]string, 7)
		ptrs := make([]any, len(cols))
		for i := range cols {
			ptrs[i] = &cols[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.Join(cols, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
