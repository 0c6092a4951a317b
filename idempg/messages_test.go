package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// messagesDB opens a DB on a fresh schema for one test.
func messagesDB(t *testing.T) *idempg.DB {
	t.Helper()
	return openDB(t, pgURL(t), idempg.Config{})
}

// effects is the inbox suite's view of a consumer's own table, written
// through WithTx so that inside Process it joins the inbox's transaction.
type effects struct{ db *idempg.DB }

func newEffects(t *testing.T, db *idempg.DB) effects {
	t.Helper()
	err := db.Migrate(t.Context(), "test_effects", fstest.MapFS{
		"0001_effects.sql": {Data: []byte(`CREATE TABLE effects (tag text NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return effects{db}
}

var errNoTx = errors.New("the context carries no transaction")

func (e effects) Write(ctx context.Context, tag string) error {
	// A write outside the inbox's transaction would commit on its own:
	// refuse it, as the suite asks.
	if !carriesTx(ctx, e.db) {
		return errNoTx
	}
	return e.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (tag) VALUES ($1)`, tag)
		return err
	})
}

// carriesTx reports whether ctx carries a transaction of db: WithTx joins
// it and hands fn the same context, where otherwise it hands a new one
// carrying its own transaction.
func carriesTx(ctx context.Context, db *idempg.DB) bool {
	joined := false
	_ = db.WithTx(ctx, func(inner context.Context, _ pgx.Tx) error {
		joined = inner == ctx
		return nil
	})
	return joined
}

func (e effects) Count(ctx context.Context, tag string) (int, error) {
	var n int
	err := e.db.Pool().QueryRow(ctx, `SELECT count(*) FROM effects WHERE tag = $1`, tag).Scan(&n)
	return n, err
}

func newInbox(t *testing.T, db *idempg.DB) *idempg.Inbox {
	t.Helper()
	in, err := idempg.NewInbox(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// An inbox joined to the caller's transaction commits and rolls back with
// it; a failing fn rolls back to the inbox's savepoint, leaving the
// caller's transaction usable and without the row.
func TestInboxJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	in, fx := newInbox(t, db), newEffects(t, db)
	write := func(ctx context.Context) error { return fx.Write(ctx, "e") }
	wantCount := func(want int, why string) {
		t.Helper()
		if n, err := fx.Count(ctx, "e"); err != nil || n != want {
			t.Errorf("%d effects (%v), want %d: %s", n, err, want, why)
		}
	}

	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if err := in.Process(ctx, "c", "m-1", write); err != nil {
			return err
		}
		if err := in.Process(ctx, "c", "m-1", write); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("Process again in the same transaction = %v, want idem.ErrDuplicate", err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	wantCount(0, "the caller rolled back")

	boom := errors.New("boom")
	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// A failing fn whose statement failed too: only the savepoint
		// makes the transaction usable again.
		err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error {
			if err := write(ctx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
				t.Error("SELECT 1/0 did not fail")
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Errorf("Process with a failing fn = %v, want fn's error", err)
		}
		// The row went with the savepoint: the message runs again.
		return in.Process(ctx, "c", "m-1", write)
	})
	if err != nil {
		t.Fatalf("WithTx after a failed fn = %v, want nil", err)
	}
	wantCount(1, "only the second run's write committed")
	if err := in.Process(ctx, "c", "m-1", write); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process after the commit = %v, want idem.ErrDuplicate", err)
	}
}

func TestPurgeInbox(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
	in := newInbox(t, db)
	nop := func(context.Context) error { return nil }
	for i, k := range []string{"a", "b", "c"} {
		clock.Set(idemtest.Start.Add(time.Duration(i) * time.Minute))
		if err := in.Process(ctx, "c", k, nop); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{0, -1} {
		if _, err := in.PurgeInbox(ctx, idemtest.Start.Add(time.Hour), limit); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("PurgeInbox(limit %d) = %v, want idem.ErrInvalidArgument", limit, err)
		}
	}
	for _, tc := range []struct {
		olderThan time.Time
		limit     int
		want      int
	}{
		{idemtest.Start, 10, 0},                    // before: a row at exactly olderThan stays
		{idemtest.Start.Add(time.Hour), 2, 2},      // the two oldest, a and b
		{idemtest.Start.Add(time.Hour), 2, 1},      // c
		{idemtest.Start.Add(2 * time.Hour), 10, 0}, // nothing left
	} {
		if n, err := in.PurgeInbox(ctx, tc.olderThan, tc.limit); err != nil || n != tc.want {
			t.Errorf("PurgeInbox(%v, %d) = %d, %v; want %d, nil", tc.olderThan, tc.limit, n, err, tc.want)
		}
	}
	// A purged message counts as new again: that is why the horizon must
	// outlast redeliveries.
	ran := false
	if err := in.Process(ctx, "c", "a", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Process after purge = %v (ran %v), want nil and a run", err, ran)
	}
}

// PurgeInbox deletes the oldest rows first.
func TestPurgeInboxOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
	in := newInbox(t, db)
	// Recorded in the order c, b, a.
	for i, k := range []string{"c", "b", "a"} {
		clock.Set(idemtest.Start.Add(time.Duration(i) * time.Second))
		if err := in.Process(ctx, "x", k, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := in.PurgeInbox(ctx, idemtest.Start.Add(time.Hour), 1); err != nil || n != 1 {
		t.Fatalf("PurgeInbox = %d, %v; want 1", n, err)
	}
	for k, wantDup := range map[string]bool{"c": false, "b": true, "a": true} {
		err := in.Process(ctx, "x", k, func(context.Context) error { return nil })
		if got := errors.Is(err, idem.ErrDuplicate); got != wantDup || (!got && err != nil) {
			t.Errorf("Process(%s) after purging one = %v, want duplicate %v", k, err, wantDup)
		}
	}
}

func TestOutboxAddJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	o, err := idempg.NewOutbox(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := func(id string) idem.Message { return idem.Message{ID: id, Topic: "payments.succeeded"} }
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if err := o.Add(ctx, m("rolled-back-1"), m("rolled-back-2")); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	var n int
	if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d outbox rows (%v) after the rollback, want 0", n, err)
	}
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return o.Add(ctx, m("committed")) })
	if err != nil {
		t.Fatal(err)
	}
	got, err := o.Claim(ctx, "r", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Message.ID != "committed" {
		t.Errorf("Claim = %+v, want only the committed entry", got)
	}
}

// A relay's open claim holds its rows: a concurrent relay skips them
// (SKIP LOCKED) instead of waiting, and takes the next ones.
func TestOutboxClaimSkipsLocked(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	o, err := idempg.NewOutbox(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []idem.Message
	for i := range 4 {
		msgs = append(msgs, idem.Message{ID: fmt.Sprint("evt-", i), Topic: "t"})
	}
	if err := o.Add(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	claimed := make(chan []idem.OutboxEntry, 1)
	done := make(chan error, 1)
	go func() {
		done <- db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
			got, err := o.Claim(ctx, "r1", 2, time.Minute)
			claimed <- got
			if err != nil {
				return err
			}
			<-release // the claim's rows stay locked until this commits
			return nil
		})
	}()
	first := <-claimed
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	second, err := o.Claim(short, "r2", 10, time.Minute)
	close(release)
	if err != nil {
		t.Fatalf("Claim while another relay's claim is open: %v (it must not wait)", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if g, w := entryIDs(first), "evt-0 evt-1"; g != w {
		t.Errorf("first Claim = %s, want %s", g, w)
	}
	if g, w := entryIDs(second), "evt-2 evt-3"; g != w {
		t.Errorf("concurrent Claim = %s, want %s", g, w)
	}
}

func entryIDs(entries []idem.OutboxEntry) string {
	var ids []string
	for _, en := range entries {
		ids = append(ids, en.Message.ID)
	}
	return strings.Join(ids, " ")
}

// Headers and payloads come back byte for byte, also those jsonb cannot
// hold; a zero time stays zero, and a time set comes back. Both of Add's
// statements are checked: several messages at once (from arrays) and one
// at a time (a single-row INSERT).
func TestOutboxRoundTripsBytes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	msgs := []idem.Message{
		{ID: "plain", Topic: "t", Headers: map[string]string{"a": "ünïcødé ✓", "": ""}, Payload: []byte("{}")},
		{ID: "binary", Topic: "t", Headers: map[string]string{"k\x00": "\xff\xfe", "ok": "v"}, Payload: []byte{0, 0xff}},
		{ID: "empty", Topic: "t", Key: "k"},
		{ID: "timed", Topic: "t", Key: "k", Payload: []byte("x"), Time: at},
	}
	for _, mode := range []string{"together", "one at a time"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			o, err := idempg.NewOutbox(ctx, messagesDB(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			if mode == "together" {
				err = o.Add(ctx, msgs...)
			} else {
				for _, m := range msgs {
					if err = o.Add(ctx, m); err != nil {
						break
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := o.Claim(ctx, "r", 10, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(msgs) {
				t.Fatalf("Claim = %d entries, want %d", len(got), len(msgs))
			}
			for i, en := range got {
				m, want := en.Message, msgs[i]
				if m.ID != want.ID || m.Key != want.Key || !maps.Equal(m.Headers, want.Headers) ||
					string(m.Payload) != string(want.Payload) || !m.Time.Equal(want.Time) {
					t.Errorf("entry %d = %+v, want %+v", i, m, want)
				}
				if en.CreatedAt.IsZero() {
					t.Errorf("entry %d: CreatedAt is zero, want the database's time", i)
				}
			}
		})
	}
}

func TestMessagesInvalidArguments(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	in := newInbox(t, db)
	o, err := idempg.NewOutbox(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := idempg.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := idempg.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context) error { return nil }
	msg := idem.Message{ID: "m", Topic: "t", Key: "k"}
	badKey := msg
	badKey.Key = "k\x00"
	badID := msg
	badID.ID = "\xff"
	letter := idem.DeadLetter{Consumer: "c", Message: msg, Class: idem.DeadPermanent}
	badLetter := letter
	badLetter.Message = badID
	checks := map[string]error{
		"Process with no consumer":     in.Process(ctx, "", "m", nop),
		"Process with no dedup key":    in.Process(ctx, "c", "", nop),
		"Process with a nil fn":        in.Process(ctx, "c", "m", nil),
		"Process with a NUL byte":      in.Process(ctx, "c", "m\x00", nop),
		"Process with invalid UTF-8":   in.Process(ctx, "c\xff", "m", nop),
		"Add a key with a NUL byte":    o.Add(ctx, badKey),
		"Add an ID of invalid UTF-8":   o.Add(ctx, msg, badID),
		"Park an ID of invalid UTF-8":  l.Park(ctx, "c", badID),
		"HoldBack a key with NUL byte": l.HoldBack(ctx, "c", "k\x00", "dl"),
		"Claim with an invalid relay": func() error {
			_, err := o.Claim(ctx, "r\xff", 1, time.Minute)
			return err
		}(),
		"Add a letter of invalid UTF-8": func() error {
			_, err := d.Add(ctx, badLetter)
			return err
		}(),
		"Resolve to an unknown state": func() error {
			_, err := d.Resolve(ctx, "dl_x", "lost", idem.LetterEvent{})
			return err
		}(),
		"List with a negative limit": func() error {
			_, err := d.List(ctx, idem.DeadLetterFilter{Limit: -1})
			return err
		}(),
		"NewInbox with a nil DB": func() error {
			_, err := idempg.NewInbox(ctx, nil)
			return err
		}(),
	}
	for what, err := range checks {
		if !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s = %v, want idem.ErrInvalidArgument", what, err)
		}
	}
	// Nothing was written.
	for _, table := range []string{"idem_inbox", "idem_outbox", "idem_dead_letters", "idem_ledger_parked", "idem_ledger_holds"} {
		var n int
		if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s has %d rows (%v) after refused calls, want 0", table, n, err)
		}
	}
	// An ID that no letter can have is simply not found.
	if _, err := d.Get(ctx, "\xff"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(invalid UTF-8) = %v, want idem.ErrNotFound", err)
	}
}

// Error texts and reasons that text cannot hold are kept, with the bad
// bytes replaced, rather than refused: a dead letter must always be
// storable.
func TestDeadLettersFreeText(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, err := idempg.NewDeadLetters(ctx, messagesDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	id, err := d.Add(ctx, idem.DeadLetter{
		Consumer: "c",
		Message:  idem.Message{ID: "m", Topic: "t", Headers: map[string]string{"h": "\x00"}, Payload: []byte{0}},
		Class:    idem.DeadPermanent,
		Attempts: []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: "bad \x00 byte \xff"}},
	})
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	dl, err := d.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dl.LastError(), "bad \uFFFD byte \uFFFD"; got != want {
		t.Errorf("LastError = %q, want %q", got, want)
	}
	if dl.Message.Headers["h"] != "\x00" || string(dl.Message.Payload) != "\x00" {
		t.Errorf("message = %+v, want its bytes kept", dl.Message)
	}
	if !dl.FirstFailedAt.IsZero() || !dl.LastFailedAt.IsZero() {
		t.Errorf("failure times = %v, %v; want zero, as added", dl.FirstFailedAt, dl.LastFailedAt)
	}
	if len(dl.History) != 1 || dl.History[0].At.IsZero() {
		t.Errorf("History = %+v, want one event stamped by the database's clock", dl.History)
	}
}

func TestDeadLettersAddJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	d, err := idempg.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("roll back")
	var id string
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if id, err = d.Add(ctx, testLetter()); err != nil {
			return err
		}
		// Inside the transaction the letter is there.
		if _, err := d.Get(ctx, id); err != nil {
			t.Errorf("Get inside the transaction: %v", err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if _, err := d.Get(ctx, id); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get after the rollback = %v, want idem.ErrNotFound", err)
	}
}

func testLetter() idem.DeadLetter {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return idem.DeadLetter{
		Consumer:      "settlement",
		Message:       idem.Message{ID: "evt-1", Topic: "payments.succeeded", Payload: []byte(`{}`)},
		Class:         idem.DeadPermanent,
		Attempts:      []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: "malformed"}},
		FirstFailedAt: at, LastFailedAt: at,
	}
}

// Of concurrent resolutions of one letter, exactly one wins.
func TestDeadLettersResolveRace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, err := idempg.NewDeadLetters(ctx, messagesDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := d.Add(ctx, testLetter())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		won, refused int
	)
	for range n {
		wg.Go(func() {
			_, err := d.Resolve(ctx, id, idem.LetterDiscarded, idem.LetterEvent{Actor: "ops", Action: "discarded", Reason: "race"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, idem.ErrInvalidTransition):
				refused++
			default:
				t.Errorf("Resolve: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || refused != n-1 {
		t.Errorf("%d won and %d were refused, want 1 and %d", won, refused, n-1)
	}
	dl, err := d.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(dl.History) != 2 {
		t.Errorf("History has %d events, want 2", len(dl.History))
	}
}

func TestLedgerJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	l, err := idempg.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if _, err := l.RecordAttempt(ctx, "c", "m-1", idem.Attempt{Number: 1, Error: "x"}); err != nil {
			return err
		}
		if err := l.HoldBack(ctx, "c", "k", "dl_1"); err != nil {
			return err
		}
		// Reads inside the transaction see its writes.
		if got, err := l.Attempts(ctx, "c", "m-1"); err != nil || len(got) != 1 {
			t.Errorf("Attempts inside the transaction = %+v, %v; want the one recorded", got, err)
		}
		if _, held, err := l.HeldBack(ctx, "c", "k"); err != nil || !held {
			t.Errorf("HeldBack inside the transaction = %v, %v; want held", held, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if got, err := l.Attempts(ctx, "c", "m-1"); err != nil || len(got) != 0 {
		t.Errorf("Attempts after the rollback = %+v, %v; want none", got, err)
	}
	if _, held, err := l.HeldBack(ctx, "c", "k"); err != nil || held {
		t.Errorf("HeldBack after the rollback = %v, %v; want not held", held, err)
	}
}

// The message tables live in the DB's schema, whatever the server's
// default search_path.
func TestMessagesTablesInSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	if _, err := idempg.NewLedger(ctx, db); err != nil {
		t.Fatal(err)
	}
	var n int
	err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE 'idem\_%'
		AND tablename <> ALL ('{idem_schema_migrations}')`, db.Schema()).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	// Eight tables of 0001_create_messages.sql and idem_inbox_sequences.
	if n != 9 {
		t.Errorf("%d message tables in schema %s, want 9", n, db.Schema())
	}
}
