package idempg_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// A batch joined to the caller's transaction records its keys and runs fn
// inside a savepoint: keys recorded earlier in the same transaction are no
// longer fresh, the caller's rollback takes the keys and the effects away,
// and a failing fn (even one whose statement broke the transaction) rolls
// back to the savepoint only, leaving the caller's transaction usable and
// the batch's keys unrecorded, so that its messages run again.
func TestInboxBatchJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	in, fx := newInbox(t, db), newEffects(t, db)
	// batch runs ProcessBatch over keys, writing an effect per fresh key,
	// and returns which keys were fresh.
	batch := func(ctx context.Context, keys ...string) ([]bool, error) {
		var got []bool
		err := in.ProcessBatch(ctx, "c", keys, func(ctx context.Context, fresh []bool) error {
			got = slices.Clone(fresh)
			for i, f := range fresh {
				if f {
					if err := fx.Write(ctx, keys[i]); err != nil {
						return err
					}
				}
			}
			return nil
		})
		return got, err
	}
	count := func(effect string) int {
		t.Helper()
		n, err := fx.Count(ctx, effect)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if fresh, err := batch(ctx, "a", "b"); err != nil || !slices.Equal(fresh, []bool{true, true}) {
			t.Errorf("the first batch in the transaction: fresh %v, %v; want both fresh", fresh, err)
		}
		if fresh, err := batch(ctx, "b", "c"); err != nil || !slices.Equal(fresh, []bool{false, true}) {
			t.Errorf("a batch repeating b in the same transaction: fresh %v, %v; want b not fresh, c fresh", fresh, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if n := count("a") + count("b") + count("c"); n != 0 {
		t.Errorf("%d effects after the caller rolled back, want none", n)
	}
	if fresh, err := batch(ctx, "a"); err != nil || !slices.Equal(fresh, []bool{true}) {
		t.Errorf("a after the caller's rollback: fresh %v, %v; want fresh (its key went with the rollback)", fresh, err)
	}

	boom := errors.New("boom")
	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		err := in.ProcessBatch(ctx, "c", []string{"x", "y"}, func(ctx context.Context, fresh []bool) error {
			if err := fx.Write(ctx, "x"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
				t.Error("SELECT 1/0 did not fail")
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Errorf("ProcessBatch with a failing fn = %v, want fn's error", err)
		}
		// The keys went with the savepoint: the messages run again.
		if fresh, err := batch(ctx, "x", "y"); err != nil || !slices.Equal(fresh, []bool{true, true}) {
			t.Errorf("the batch again after its fn failed: fresh %v, %v; want both fresh", fresh, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("WithTx after a failed fn = %v, want nil", err)
	}
	if nx, ny := count("x"), count("y"); nx != 1 || ny != 1 {
		t.Errorf("effects x %d, y %d; want one each, from the second run", nx, ny)
	}
	if fresh, err := batch(ctx, "x", "y", "z"); err != nil || !slices.Equal(fresh, []bool{false, false, true}) {
		t.Errorf("after the commit: fresh %v, %v; want x and y recorded, z fresh", fresh, err)
	}
	if err := in.ProcessBatch(ctx, "c", []string{"q"}, nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("ProcessBatch with no fn = %v, want idem.ErrInvalidArgument", err)
	}
}
