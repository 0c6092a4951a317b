package idempg_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

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
	idemtest.TestPerKeyOrder(t, tr, tr, idemtest.OrderOptions{
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
		Apply: func(ctx context.Context, e idemtest.AppliedEffect) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq, id) VALUES ($1, $2, $3)`, e.Key, e.Seq, e.ID)
				return err
			})
		},
		// What committed. A key's next message runs only after the
		// previous one committed, so within a key the identity n follows
		// commit order.
		Applied: func(t *testing.T) []idemtest.AppliedEffect {
			rows, err := db.Pool().Query(ctx, `SELECT key, seq, id FROM applied ORDER BY n`)
			if err != nil {
				t.Fatal(err)
			}
			var out []idemtest.AppliedEffect
			var e idemtest.AppliedEffect
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
