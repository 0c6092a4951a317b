// This file runs every conformance suite of idemtest that idempg
// qualifies for; the package's own tests are in the other files.
//
// Passes all of them: TestStore and TestTxEffects (Store), TestInbox
// (Inbox), TestOutbox (Outbox), TestDeadLetters (DeadLetters), TestLedger
// (Ledger), TestTransport (Transport) on the suite's manual clock and on
// the database's, TestOutboxMover (Transport's MoveOutbox of an Outbox in
// the same database), and TestPerKeyOrder (the consumer over the
// Transport, with the Inbox, Ledger and DeadLetters).

package idempg_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, openDB(t, url, idempg.Config{Clock: clock}))
	})
}

// The middleware on the store, in the same-transaction form.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, openDB(t, url, idempg.Config{Clock: clock}))
	})
}

// The engine's behaviours through idemhttp, in the ClaimTx form (and the
// others, where a case needs them).
func TestFace(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	idemtest.TestFace(t, idemtest.HTTP, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, openDB(t, url, idempg.Config{Clock: clock}))
	})
}

// The work's writes commit with the completion, or not at all.
// txRunner is DB.WithTx as idemtest.TestWithTx takes it.
type txRunner struct{ db *idempg.DB }

func (r txRunner) WithTx(ctx context.Context, fn func(context.Context) error) error {
	return r.db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
}

func TestWithTx(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	idemtest.TestWithTx(t, func(t *testing.T, clock idem.Clock) (idemtest.TxRunner, idem.Store, idemtest.InboxEffects) {
		db := openDB(t, url, idempg.Config{Clock: clock})
		return txRunner{db}, newStore(t, db), newEffects(t, db)
	})
}

func TestTxEffects(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	idemtest.TestTxEffects(t, func(t *testing.T, clock idem.Clock) (idem.TxStore, idemtest.InboxEffects) {
		db := openDB(t, url, idempg.Config{Clock: clock})
		return newStore(t, db), newEffects(t, db)
	})
}

func TestRecoverer(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	idemtest.TestRecoverer(t, func(t *testing.T, clock idem.Clock) (idem.Recoverer, idemtest.TxRunner, idemtest.InboxEffects) {
		db := openDB(t, url, idempg.Config{Clock: clock})
		return newStore(t, db), txRunner{db}, newEffects(t, db)
	})
}

func TestInbox(t *testing.T) {
	t.Parallel()
	idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
		db := messagesDB(t)
		return newInbox(t, db), newEffects(t, db)
	})
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	idemtest.TestOutbox(t, func(t *testing.T, clock idem.Clock) idem.Outbox {
		o, err := idempg.NewOutbox(t.Context(), messagesDB(t), &idempg.OutboxConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return o
	})
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	idemtest.TestDeadLetters(t, func(t *testing.T, clock idem.Clock) idem.DeadLetters {
		d, err := idempg.NewDeadLetters(t.Context(), messagesDB(t), &idempg.DeadLettersConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

func TestLedger(t *testing.T) {
	t.Parallel()
	idemtest.TestLedger(t, func(t *testing.T) idem.Ledger {
		l, err := idempg.NewLedger(t.Context(), messagesDB(t))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

var transportFeatures = idemtest.TransportFeatures{
	DelayedNack:     true,
	AttemptCount:    true,
	AckWait:         true,
	InProgress:      true,
	Term:            true,
	OrderedPerTopic: true,
}

// The suite, on the suite's manual clock.
func TestTransport(t *testing.T) {
	t.Parallel()
	db := transportDB(t)
	idemtest.TestTransport(t, transportFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := newTransport(t, db, idempg.TransportConfig{Clock: clock})
		return tr, tr
	})
}

// The suite again on the database's clock, the default, in real time.
func TestTransportDatabaseClock(t *testing.T) {
	t.Parallel()
	db := transportDB(t)
	f := transportFeatures
	f.RealTime, f.Tick = true, 200*time.Millisecond
	idemtest.TestTransport(t, f, func(t *testing.T, _ idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := newTransport(t, db, idempg.TransportConfig{})
		return tr, tr
	})
}

func TestOutboxMover(t *testing.T) {
	t.Parallel()
	idemtest.TestOutboxMover(t, func(t *testing.T, clock idem.Clock) idemtest.MoverWorld {
		db := messagesDB(t)
		ob, err := idempg.NewOutbox(t.Context(), db, &idempg.OutboxConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		tr := newTransport(t, db, idempg.TransportConfig{Clock: clock})
		return idemtest.MoverWorld{Outbox: ob, Mover: tr, Subscriber: tr}
	})
}

// The consumer keeps each key's order across retries through the
// PostgreSQL transport: 10,000 messages over 100 keys, a quarter of early
// attempts failing. Everything lives in one schema: the transport's log,
// the inbox, the ledger, the dead letters, and the handler's effect, a row
// appended in the inbox's transaction. The order is read back from the
// committed rows, so a failed attempt whose write was not rolled back with
// its inbox row, a message applied twice or a key's messages applied out of
// order all show.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Room for the consumer's inbox transactions, its takes and
	// settlements, and the publishers at once.
	db := openDB(t, pgURL(t), idempg.Config{MaxConns: 8})
	err := db.Migrate(ctx, "test_order", fstest.MapFS{
		// No unique constraint: a message applied twice must show, not fail.
		"0001_applied.sql": {Data: []byte(`CREATE TABLE applied (
			n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			key text NOT NULL, seq integer NOT NULL, id text NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The default Poll: publishes and settlements wake the stream through
	// LISTEN/NOTIFY and in process, not polling.
	tr := newTransport(t, db, idempg.TransportConfig{Poll: 250 * time.Millisecond})
	inbox, err := idempg.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := idempg.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := idempg.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{
		CopiesDelivered: true,
		// Generous for a loaded machine: under the race detector, beside
		// another package's tests on two cores, the test has taken 50s
		// where it takes 15s alone.
		Wait:        2 * time.Minute,
		Inbox:       inbox,
		DeadLetters: letters,
		Ledger:      ledger,
		InTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
		},
		Apply: func(ctx context.Context, e consumertest.AppliedEffect) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq, id) VALUES ($1, $2, $3)`, e.Key, e.Seq, e.ID)
				return err
			})
		},
		// What committed. A key's next message runs only after the
		// previous one committed, so within a key the identity n follows
		// commit order.
		Applied: func(t *testing.T) []consumertest.AppliedEffect {
			rows, err := db.Pool().Query(ctx, `SELECT key, seq, id FROM applied ORDER BY n`)
			if err != nil {
				t.Fatal(err)
			}
			var out []consumertest.AppliedEffect
			var e consumertest.AppliedEffect
			if _, err := pgx.ForEachRow(rows, []any{&e.Key, &e.Seq, &e.ID}, func() error {
				out = append(out, e)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return out
		},
		// Every copy reached the inbox, every delivery was acknowledged,
		// and nothing was left in the ledger.
		Check: func(t *testing.T, s consumer.Stats, messages, copies int) {
			if s.Duplicates != int64(copies) {
				t.Errorf("%d duplicates, want %d: each copy once", s.Duplicates, copies)
			}
			var pending, inboxRows, attempts int
			if err := db.Pool().QueryRow(ctx, `SELECT
				(SELECT count(*) FROM idem_transport_pending),
				(SELECT count(*) FROM idem_inbox WHERE consumer = 'settlement'),
				(SELECT count(*) FROM idem_ledger_attempts)`).Scan(&pending, &inboxRows, &attempts); err != nil {
				t.Fatal(err)
			}
			if pending != 0 || inboxRows != messages || attempts != 0 {
				t.Errorf("%d deliveries unsettled, %d inbox rows, %d recorded attempts left; want 0, %d, 0",
					pending, inboxRows, attempts, messages)
			}
		},
	})
}
