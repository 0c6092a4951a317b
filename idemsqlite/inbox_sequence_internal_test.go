package idemsqlite

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
)

// ProcessSequence runs its statements prepared, like Process.
func TestProcessSequencePrepared(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	in, err := NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context) error { return nil }
	for seq := uint64(1); seq <= 3; seq++ {
		if err := in.ProcessSequence(ctx, "c", "acct-1", seq, idem.GapHold, nop); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.ProcessSequence(ctx, "c", "acct-1", 2, idem.GapHold, nop); !errors.Is(err, idem.ErrDuplicate) {
		t.Fatalf("ProcessSequence(2) = %v, want idem.ErrDuplicate", err)
	}
	if n := db.stmts.unprepared.Load(); n != 0 {
		t.Errorf("%d statements ran unprepared", n)
	}
}
