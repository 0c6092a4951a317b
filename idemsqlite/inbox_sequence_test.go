package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// ProcessSequence joined to the caller's transaction commits and rolls
// back with it. A failing fn leaves the mark as it was even when the
// caller goes on and commits: the mark is written only after fn succeeded.
func TestInboxSequenceJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	in, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	fx := newEffects(t, db)
	write := func(ctx context.Context) error { return fx.Write(ctx, "e") }

	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write); err != nil {
			return err
		}
		if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("ProcessSequence again in the same transaction = %v, want idem.ErrDuplicate", err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if n, _ := fx.Count(ctx, "e"); n != 0 {
		t.Errorf("%d effects after the caller rolled back, want 0", n)
	}

	boom := errors.New("boom")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error { return boom }); !errors.Is(err, boom) {
			t.Errorf("ProcessSequence with a failing fn = %v, want fn's error", err)
		}
		return nil // the caller commits anyway
	})
	if err != nil {
		t.Fatal(err)
	}
	// Neither the rolled-back caller nor the failed fn left a mark.
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write); err != nil {
		t.Fatalf("ProcessSequence after the rollback and the failure = %v, want nil", err)
	}
	if n, _ := fx.Count(ctx, "e"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// Marks past 2^63-1 are kept in SQLite's signed INTEGER by their bits, and
// come back exact.
func TestInboxSequenceStoredMark(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	in, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context) error { return nil }
	for _, tc := range []struct {
		aggregate string
		seq       uint64
		stored    int64
	}{
		{"small", 42, 42},
		{"past 2^63", 1<<63 + 1, math.MinInt64 + 1},
		{"largest", math.MaxUint64, -1},
	} {
		if err := in.ProcessSequence(ctx, "c", tc.aggregate, tc.seq, idem.GapAllow, nop); err != nil {
			t.Fatal(err)
		}
		var stored int64
		if err := db.Reader().QueryRowContext(ctx, `SELECT mark FROM idem_inbox_sequences WHERE consumer = 'c' AND aggregate = ?`, tc.aggregate).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != tc.stored {
			t.Errorf("%s: stored %d, want %d", tc.aggregate, stored, tc.stored)
		}
		if err := in.ProcessSequence(ctx, "c", tc.aggregate, tc.seq, idem.GapAllow, nop); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("%s: ProcessSequence(%d) again = %v, want idem.ErrDuplicate", tc.aggregate, tc.seq, err)
		}
		if tc.seq < math.MaxUint64 {
			if err := in.ProcessSequence(ctx, "c", tc.aggregate, tc.seq+1, idem.GapHold, nop); err != nil {
				t.Errorf("%s: ProcessSequence(%d) = %v, want nil", tc.aggregate, tc.seq+1, err)
			}
		}
	}
}
