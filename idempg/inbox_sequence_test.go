package idempg_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// markOf reads the stored mark of (consumer, aggregate) as text, "" when
// it has no row.
func markOf(t *testing.T, db *idempg.DB, consumer, aggregate string) string {
	t.Helper()
	var mark string
	err := db.Pool().QueryRow(t.Context(), `SELECT mark::text FROM idem_inbox_sequences WHERE consumer = $1 AND aggregate = $2`,
		consumer, aggregate).Scan(&mark)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return mark
}

// ProcessSequence joined to the caller's transaction commits and rolls
// back with it; a failing fn rolls back to the inbox's savepoint, leaving
// the caller's transaction usable and the mark as it was.
func TestInboxSequenceJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := messagesDB(t)
	in, fx := newInbox(t, db), newEffects(t, db)
	write := func(ctx context.Context) error { return fx.Write(ctx, "e") }
	wantCount := func(want int, why string) {
		t.Helper()
		if n, err := fx.Count(ctx, "e"); err != nil || n != want {
			t.Errorf("%d effects (%v), want %d: %s", n, err, want, why)
		}
	}

	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write); err != nil {
			return err
		}
		if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("ProcessSequence again in the same transaction = %v, want idem.ErrDuplicate", err)
		}
		if err := in.ProcessSequence(ctx, "c", "acct-1", 3, idem.GapHold, write); !errors.Is(err, idem.ErrSequenceGap) {
			t.Errorf("ProcessSequence past a gap in the same transaction = %v, want a gap", err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	wantCount(0, "the caller rolled back")
	if m := markOf(t, db, "c", "acct-1"); m != "" {
		t.Errorf("mark %q after the caller rolled back, want no row", m)
	}

	boom := errors.New("boom")
	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// A failing fn whose statement failed too: only the savepoint
		// makes the transaction usable again.
		err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
			if err := write(ctx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
				t.Error("SELECT 1/0 did not fail")
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Errorf("ProcessSequence with a failing fn = %v, want fn's error", err)
		}
		// The mark went with the savepoint: the message runs again.
		return in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write)
	})
	if err != nil {
		t.Fatalf("WithTx after a failed fn = %v, want nil", err)
	}
	wantCount(1, "only the second run's write committed")
	if m := markOf(t, db, "c", "acct-1"); m != "1" {
		t.Errorf("mark %q, want 1", m)
	}
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, write); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("ProcessSequence after the commit = %v, want idem.ErrDuplicate", err)
	}
}

// A call that finds its aggregate's row being created by another
// transaction waits for it, then reads what it committed (a duplicate), or
// creates the row itself if it rolled back (fn runs).
func TestInboxSequenceWaitsForTheRowsCreator(t *testing.T) {
	t.Parallel()
	for _, outcome := range []string{"commits", "rolls back"} {
		t.Run(outcome, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			url := pgURL(t)
			first := openDB(t, url, idempg.Config{})
			app := randomName("seqwait_")
			// The second DB shares the schema; its sessions carry a name of
			// their own, so that the test sees when they wait.
			second := openDB(t, withAppName(url, app), idempg.Config{Schema: first.Schema()})
			in1, in2 := newInbox(t, first), newInbox(t, second)

			inside, release := make(chan struct{}), make(chan struct{})
			boom := errors.New("boom")
			firstErr := make(chan error, 1)
			go func() {
				firstErr <- in1.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
					close(inside)
					if err := await(ctx, release); err != nil {
						return err
					}
					if outcome == "rolls back" {
						return boom
					}
					return nil
				})
			}()
			receive(t, inside, "the first ProcessSequence did not call fn")
			ran := false
			secondErr := make(chan error, 1)
			go func() {
				secondErr <- in2.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error {
					ran = true
					return nil
				})
			}()
			idemtest.Eventually(t, 10*time.Second, "the second call to wait for the row's lock", func() bool {
				var n int
				err := first.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
				return err == nil && n > 0
			})
			close(release)
			switch err := receive(t, firstErr, "the first ProcessSequence did not return once fn did"); {
			case outcome == "commits" && err != nil:
				t.Fatalf("first ProcessSequence = %v, want nil", err)
			case outcome == "rolls back" && !errors.Is(err, boom):
				t.Fatalf("first ProcessSequence = %v, want fn's error", err)
			}
			err := receive(t, secondErr, "the second ProcessSequence did not return once the first ended")
			switch outcome {
			case "commits":
				if !errors.Is(err, idem.ErrDuplicate) || ran {
					t.Errorf("second ProcessSequence = %v (ran %v), want idem.ErrDuplicate without a run", err, ran)
				}
			case "rolls back":
				if err != nil || !ran {
					t.Errorf("second ProcessSequence = %v (ran %v), want nil and a run", err, ran)
				}
			}
			if m := markOf(t, first, "c", "acct-1"); m != "1" {
				t.Errorf("mark %q, want 1", m)
			}
		})
	}
}

// The mark is stored as the number it is, up to the largest uint64, and
// dated by the DB's clock.
func TestInboxSequenceStoredMark(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
	in := newInbox(t, db)
	nop := func(context.Context) error { return nil }
	if err := in.ProcessSequence(ctx, "c", "acct-1", math.MaxUint64, idem.GapAllow, nop); err != nil {
		t.Fatal(err)
	}
	if m := markOf(t, db, "c", "acct-1"); m != "18446744073709551615" {
		t.Errorf("mark %q, want 18446744073709551615", m)
	}
	var at time.Time
	if err := db.Pool().QueryRow(ctx, `SELECT updated_at FROM idem_inbox_sequences`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	if !at.Equal(idemtest.Start) {
		t.Errorf("updated_at %v, want the DB's clock, %v", at, idemtest.Start)
	}
	// A duplicate and a gap write nothing.
	clock.Advance(time.Minute)
	if err := in.ProcessSequence(ctx, "c", "acct-1", 5, idem.GapHold, nop); !errors.Is(err, idem.ErrDuplicate) {
		t.Fatal(err)
	}
	if err := db.Pool().QueryRow(ctx, `SELECT updated_at FROM idem_inbox_sequences`).Scan(&at); err != nil || !at.Equal(idemtest.Start) {
		t.Errorf("updated_at %v (%v) after a duplicate, want it unchanged", at, err)
	}
	for _, bad := range []struct{ field, consumer, aggregate string }{
		{"consumer", "c\x00", "acct-1"},
		{"aggregate", "c", "acct-\xff"},
	} {
		var ae *idem.ArgumentError
		if err := in.ProcessSequence(ctx, bad.consumer, bad.aggregate, 1, idem.GapHold, nop); !errors.As(err, &ae) || ae.Field != bad.field {
			t.Errorf("ProcessSequence(%q, %q) = %v, want an *idem.ArgumentError for %s", bad.consumer, bad.aggregate, err, bad.field)
		}
	}
}
