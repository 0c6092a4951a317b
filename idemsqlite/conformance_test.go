// This file runs every conformance suite of idemtest that idemsqlite
// qualifies for; the package's own tests are in the other files.
//
// Passes all of them: TestStore, TestTxEffects and TestRecoverer (Store), TestInbox
// (Inbox), TestOutbox (Outbox), TestDeadLetters (DeadLetters), TestLedger
// (Ledger), TestTransport (Transport), TestOutboxMover (Transport's
// MoveOutbox of an Outbox in the same file), and TestPerKeyOrder (the
// consumer over the Transport, with the Inbox, Ledger and DeadLetters).

package idemsqlite_test

import (
	"context"
	"database/sql"
	"flag"
	"path/filepath"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, openDB(t), clock)
	})
}

// What group commit must not cost a claim or a completion: the claim's
// lease counts from when it is acknowledged, and a refusal waits for its
// group's fate. The groups stay open as long as transactions queue.
func TestSerialWriter(t *testing.T) {
	t.Parallel()
	idemtest.TestSerialWriter(t, func(t *testing.T, clock idem.Clock) (idem.SerialWriter, idemtest.WriterControl) {
		db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "serial.db"), &idemsqlite.Config{GroupCommit: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		err = db.Migrate(t.Context(), "test_hold", fstest.MapFS{"0001_hold.sql": {Data: []byte(`
			CREATE TABLE holds (id INTEGER PRIMARY KEY);
			CREATE TABLE parents (id INTEGER PRIMARY KEY);
			CREATE TABLE orphans (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED);`)}})
		if err != nil {
			t.Fatal(err)
		}
		return newStore(t, db, clock), idemtest.WriterControl{
			Hold: func(ctx context.Context, fail bool) (<-chan struct{}, func(), <-chan error) {
				held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
				go func() {
					done <- db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
						if _, err := tx.ExecContext(ctx, `INSERT INTO holds DEFAULT VALUES`); err != nil {
							return err
						}
						close(held)
						<-release
						if fail {
							// Checked at COMMIT: the whole group fails.
							_, err := tx.ExecContext(ctx, `INSERT INTO orphans (parent) VALUES (42)`)
							return err
						}
						return nil
					})
				}()
				return held, sync.OnceFunc(func() { close(release) }), done
			},
			Waiting: func(t *testing.T, n int) { idemsqlite.WaitingForWriter(t, db, n) },
		}
	})
}

// The work's writes commit with the completion, or not at all.
func TestTxEffects(t *testing.T) {
	t.Parallel()
	idemtest.TestTxEffects(t, func(t *testing.T, clock idem.Clock) (idem.TxStore, idemtest.InboxEffects) {
		db := openDB(t)
		return newStore(t, db, clock), newEffects(t, db)
	})
}

// txRunner is DB.WithTx as idemtest.TestWithTx takes it.
type txRunner struct{ db *idemsqlite.DB }

func (r txRunner) WithTx(ctx context.Context, fn func(context.Context) error) error {
	return r.db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
}

func TestWithTx(t *testing.T) {
	t.Parallel()
	idemtest.TestWithTx(t, func(t *testing.T, clock idem.Clock) (idemtest.TxRunner, idem.Store, idemtest.InboxEffects) {
		db := openDB(t)
		return txRunner{db}, newStore(t, db, clock), newEffects(t, db)
	})
}

func TestRecoverer(t *testing.T) {
	t.Parallel()
	idemtest.TestRecoverer(t, func(t *testing.T, clock idem.Clock) (idem.Recoverer, idemtest.TxRunner, idemtest.InboxEffects) {
		db := openDB(t)
		return newStore(t, db, clock), txRunner{db}, newEffects(t, db)
	})
}

func TestInbox(t *testing.T) {
	t.Parallel()
	idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
		db := openMessagesDB(t)
		in, err := idemsqlite.NewInbox(t.Context(), db)
		if err != nil {
			t.Fatal(err)
		}
		return in, newEffects(t, db)
	})
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	idemtest.TestOutbox(t, func(t *testing.T, clock idem.Clock) idem.Outbox {
		o, err := idemsqlite.NewOutbox(t.Context(), openMessagesDB(t), &idemsqlite.OutboxConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return o
	})
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	idemtest.TestDeadLetters(t, func(t *testing.T, clock idem.Clock) idem.DeadLetters {
		d, err := idemsqlite.NewDeadLetters(t.Context(), openMessagesDB(t), &idemsqlite.DeadLettersConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

func TestLedger(t *testing.T) {
	t.Parallel()
	idemtest.TestLedger(t, func(t *testing.T) idem.Ledger {
		l, err := idemsqlite.NewLedger(t.Context(), openMessagesDB(t))
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

func TestTransport(t *testing.T) {
	t.Parallel()
	idemtest.TestTransport(t, transportFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := newTransport(t, openMessagesDB(t), clock)
		return tr, tr
	})
}

// The suite every OutboxMover passes.
func TestOutboxMoverSuite(t *testing.T) {
	t.Parallel()
	idemtest.TestOutboxMover(t, func(t *testing.T, clock idem.Clock) idemtest.MoverWorld {
		db := openMessagesDB(t)
		ob, err := idemsqlite.NewOutbox(t.Context(), db, &idemsqlite.OutboxConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		tr := newTransport(t, db, clock)
		return idemtest.MoverWorld{Outbox: ob, Mover: tr, Subscriber: tr}
	})
}

// fullOrder runs TestPerKeyOrderWithTransientFailures at the size of the
// brokers' tests, 10,000 messages over 100 keys, instead of 500 over 10.
// Under the race detector every step through the transpiled SQLite engine
// is instrumented, and each message takes a dozen statements or more on the
// single writer (hand-out, inbox, effect, ledger, acknowledgement), so the
// full size takes minutes there; without -race it takes seconds.
var fullOrder = flag.Bool("idemsqlite.full", false, "run the per-key order test with 10,000 messages over 100 keys")

// The consumer keeps each key's order across retries through the embedded
// transport: 500 messages over 10 keys (10,000 over 100 with
// -idemsqlite.full), a quarter of early attempts failing. Everything lives
// in one file: the transport's log, the inbox, the ledger, the dead
// letters, and the handler's effect, a row appended in the inbox's
// transaction. The order is read back from the committed rows, so a failed
// attempt whose write was not rolled back with its inbox row, a message
// applied twice or a key's messages applied out of order all show.
//
// Each handler runs in an inbox transaction, which holds the only writer
// connection, so handlers never overlap here; the suite's check that two
// messages of a key never run at once guards against that changing.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	// Few keys by default: the order check catches a message that
	// overtakes an earlier one of its key only if it is delivered while
	// that one waits for its retry, and the single writer paces the
	// hand-outs, so over many keys a key's next message seldom comes soon
	// enough. The waits are generous for a loaded machine: under the race
	// detector, beside other tests on two cores, the default size has taken
	// 50s where it takes 10s alone.
	messages, keys, wait := 500, 10, 2*time.Minute
	if *fullOrder {
		messages, keys, wait = 10000, 100, 8*time.Minute
	}
	ctx := t.Context()
	db := openMessagesDB(t)
	err := db.Migrate(ctx, "test_order", fstest.MapFS{
		// No unique constraint: a message applied twice must show, not fail.
		"0001_applied.sql": {Data: []byte(`CREATE TABLE applied (
			n INTEGER PRIMARY KEY AUTOINCREMENT,
			key TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := idemsqlite.NewTransport(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{
		Messages:        messages,
		Keys:            keys,
		CopiesDelivered: true,
		Wait:            wait,
		Inbox:           inbox,
		DeadLetters:     letters,
		Ledger:          ledger,
		InTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
		// Joins the inbox's transaction: a write of its own would wait for
		// the writer that transaction holds, and the test would time out.
		Apply: func(ctx context.Context, e consumertest.AppliedEffect) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO applied (key, seq, id) VALUES (?, ?, ?)`, e.Key, e.Seq, e.ID)
				return err
			})
		},
		// What committed, in the order it committed: the single writer
		// gives out the autoincrement n in commit order.
		Applied: func(t *testing.T) []consumertest.AppliedEffect {
			rows, err := db.Reader().QueryContext(ctx, `SELECT key, seq, id FROM applied ORDER BY n`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []consumertest.AppliedEffect
			for rows.Next() {
				var e consumertest.AppliedEffect
				if err := rows.Scan(&e.Key, &e.Seq, &e.ID); err != nil {
					t.Fatal(err)
				}
				out = append(out, e)
			}
			if err := rows.Err(); err != nil {
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
			if err := db.Reader().QueryRowContext(ctx, `SELECT
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
