package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// waitingOn waits until a session of the application app waits for a lock
// in a statement that begins with prefix.
func waitingOn(t *testing.T, db *idempg.DB, app, prefix string) {
	t.Helper()
	idemtest.Eventually(t, 10*time.Second, "a session blocked in "+prefix, func() bool {
		var n int
		err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE $2`, app, prefix+"%").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// A consumer that saw the hold in its transaction and parks behind it,
// while a person lets the key go: the parked message is among those LetGo
// returns, never left behind a hold that no longer exists.
func TestLedgerParkDuringLetGo(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	app := randomName("idem_letgo_")
	db := openDB(t, withAppName(url, app), idempg.Config{})
	ctx := t.Context()
	l, err := idempg.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.HoldBack(ctx, "c", "k", "letter-1"); err != nil {
		t.Fatal(err)
	}
	m := idem.Message{ID: "m-2", Topic: "t", Key: "k", Payload: []byte("2")}

	type letGo struct {
		msgs []idem.Message
		err  error
	}
	let := make(chan letGo, 1)
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if _, held, err := l.HeldBack(ctx, "c", "k"); err != nil || !held {
			t.Fatalf("HeldBack = %v, %v; want held", held, err)
		}
		go func() {
			msgs, err := l.LetGo(context.Background(), "c", "k")
			let <- letGo{msgs, err}
		}()
		// LetGo waits for this transaction before it clears the hold.
		waitingOn(t, db, app, "DELETE FROM idem_ledger_holds")
		return l.Park(ctx, "c", m)
	})
	if err != nil {
		t.Fatal(err)
	}
	r := <-let
	if r.err != nil || len(r.msgs) != 1 || r.msgs[0].ID != "m-2" {
		t.Fatalf("LetGo = %v, %v; want the message parked while it waited", r.msgs, r.err)
	}
	if _, held, err := l.HeldBack(ctx, "c", "k"); err != nil || held {
		t.Fatalf("HeldBack after LetGo = %v, %v; want not held", held, err)
	}
}

// The other order: LetGo has cleared the hold but not committed; a
// consumer asking in its transaction waits, and then finds the key free.
func TestLedgerHeldBackDuringLetGo(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	app := randomName("idem_heldback_")
	db := openDB(t, withAppName(url, app), idempg.Config{})
	ctx := t.Context()
	l, err := idempg.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.HoldBack(ctx, "c", "k", "letter-1"); err != nil {
		t.Fatal(err)
	}
	held := make(chan bool, 1)
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if _, err := l.LetGo(ctx, "c", "k"); err != nil {
			return err
		}
		go func() {
			_ = db.WithTx(context.Background(), func(ctx context.Context, _ pgx.Tx) error {
				_, h, err := l.HeldBack(ctx, "c", "k")
				if err != nil {
					t.Error(err)
				}
				held <- h
				return nil
			})
		}()
		waitingOn(t, db, app, "SELECT letter_id FROM idem_ledger_holds")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if <-held {
		t.Fatal("HeldBack in a transaction that waited for LetGo's commit = held, want not held")
	}
}
