package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

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

func TestDeadLettersAddJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	d, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("roll back")
	var id string
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
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

// Of concurrent resolutions of one letter, exactly one wins.
func TestDeadLettersResolveRace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, err := idemsqlite.NewDeadLetters(ctx, openMessagesDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := d.Add(ctx, testLetter())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		won     int
		refused int
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
