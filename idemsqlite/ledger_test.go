package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

func TestLedgerJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	l, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
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
