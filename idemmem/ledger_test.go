package idemmem_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func TestLedgerJoinsTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	l := idemmem.NewLedger()
	a := func(n int) idem.Attempt {
		return idem.Attempt{Number: n, At: start, Class: idem.ClassTransient, Error: "e"}
	}
	if _, err := l.RecordAttempt(ctx, "c", "m1", a(1)); err != nil {
		t.Fatal(err)
	}
	_ = l.HoldBack(ctx, "c", "k", "dl-1")
	_ = l.Park(ctx, "c", idem.Message{ID: "m2", Topic: "t", Key: "k"})

	// A rolled back Tx changes nothing, though its methods answered as if
	// their writes had happened.
	_ = idemmem.Transact(ctx, func(ctx context.Context) error {
		all, _ := l.RecordAttempt(ctx, "c", "m1", a(2))
		if len(all) != 2 {
			t.Errorf("RecordAttempt in a Tx returned %d attempts, want 2", len(all))
		}
		if got, _ := l.LetGo(ctx, "c", "k"); len(got) != 1 {
			t.Errorf("LetGo in a Tx returned %d messages, want 1", len(got))
		}
		_ = l.ForgetAttempts(ctx, "c", "m1")
		return errors.New("rolled back")
	})
	if got, _ := l.Attempts(ctx, "c", "m1"); len(got) != 1 {
		t.Errorf("%d attempts after a rolled back Tx, want 1", len(got))
	}
	if _, held, _ := l.HeldBack(ctx, "c", "k"); !held {
		t.Error("a rolled back LetGo let go of the key")
	}

	// A message parked while a LetGo's Tx is open stays parked.
	err := idemmem.Transact(ctx, func(ctx context.Context) error {
		got, err := l.LetGo(ctx, "c", "k")
		if err != nil || len(got) != 1 {
			t.Errorf("LetGo = %d messages, %v; want 1", len(got), err)
		}
		return l.Park(context.Background(), "c", idem.Message{ID: "m3", Topic: "t", Key: "k"})
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := l.LetGo(ctx, "c", "k")
	if len(got) != 1 || got[0].ID != "m3" {
		t.Errorf("LetGo after the committed one = %v, want [m3]", got)
	}
}
