package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func batchStream(t *testing.T, tr *idemsqlite.Transport, sub idem.Subscription) idem.BatchStream {
	t.Helper()
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(idem.BatchStream)
}

func nextBatch(t *testing.T, s idem.BatchStream, max int) []idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ds, err := s.NextBatch(ctx, max)
	if err != nil {
		t.Fatalf("NextBatch(%d): %v", max, err)
	}
	return ds
}

func publishN(t *testing.T, tr *idemsqlite.Transport, topic string, n int) []string {
	t.Helper()
	all := ids("m", n)
	msgs := make([]idem.Message, n)
	for i, id := range all {
		msgs[i] = idem.Message{ID: id, Topic: topic}
	}
	if err := tr.Publish(t.Context(), msgs...); err != nil {
		t.Fatal(err)
	}
	return all
}

func messageIDs(ds []idem.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Message().ID
	}
	return out
}

// AckBatch joins the caller's transaction, and AcksInTx says so: rolled
// back with it, the deliveries still hold their messages.
func TestAckBatchJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	tr := newTransport(t, db, idemmem.NewClock(idemtest.Start))
	s := batchStream(t, tr, idem.Subscription{Topic: "payments", Consumer: "c", AckWait: time.Hour})
	publishN(t, tr, "payments", 3)
	ds := nextBatch(t, s, 10)
	if len(ds) != 3 {
		t.Fatalf("NextBatch = %d deliveries, want 3", len(ds))
	}
	if s.AcksInTx(ctx) {
		t.Error("AcksInTx(a context without a transaction) = true")
	}
	other := openMessagesDB(t)
	_ = other.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if s.AcksInTx(ctx) {
			t.Error("AcksInTx(a context with another DB's transaction) = true")
		}
		return nil
	})
	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if !s.AcksInTx(ctx) {
			t.Error("AcksInTx(a context with the DB's transaction) = false")
		}
		if n, err := s.AckBatch(ctx, ds); err != nil || n != 3 {
			t.Errorf("AckBatch in the transaction = %d, %v; want 3", n, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if n, err := s.AckBatch(ctx, ds); err != nil || n != 3 {
		t.Errorf("AckBatch after the rolled-back one = %d, %v; want 3", n, err)
	}
	if n, err := s.AckBatch(ctx, ds); err != nil || n != 0 {
		t.Errorf("AckBatch again = %d, %v; want 0", n, err)
	}
}

// NextBatch hands out no more than MaxInFlight, oldest first, and more as
// acknowledgements make room.
func TestNextBatchMaxInFlight(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := newTransport(t, openMessagesDB(t), idemmem.NewClock(idemtest.Start))
	s := batchStream(t, tr, idem.Subscription{Topic: "payments", Consumer: "c", MaxInFlight: 3, AckWait: time.Hour})
	all := publishN(t, tr, "payments", 10)
	first := nextBatch(t, s, 10)
	if got := messageIDs(first); !slices.Equal(got, all[:3]) {
		t.Fatalf("NextBatch = %v, want %v: MaxInFlight is 3", got, all[:3])
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if ds, err := s.NextBatch(short, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NextBatch with 3 in flight = %v, %v; want to wait", messageIDs(ds), err)
	}
	if err := first[1].Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := s.AckBatch(ctx, []idem.Delivery{first[0]}); err != nil || n != 1 {
		t.Fatalf("AckBatch = %d, %v", n, err)
	}
	// m-01 comes again before the new m-03: redeliveries first.
	if got, want := messageIDs(nextBatch(t, s, 10)), []string{all[1], all[3]}; !slices.Equal(got, want) {
		t.Errorf("NextBatch after a Nack and an Ack = %v, want %v", got, want)
	}
}

func TestAckBatchInvalid(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := newTransport(t, openMessagesDB(t), idemmem.NewClock(idemtest.Start))
	sub := idem.Subscription{Topic: "payments", Consumer: "c", AckWait: time.Hour}
	a, b := batchStream(t, tr, sub), batchStream(t, tr, sub)
	publishN(t, tr, "payments", 2)
	da := nextBatch(t, a, 1)
	db := nextBatch(t, b, 1)
	if n, err := a.AckBatch(ctx, append(da, db...)); !errors.Is(err, idem.ErrInvalidArgument) || n != 0 {
		t.Errorf("AckBatch with another stream's delivery = %d, %v; want idem.ErrInvalidArgument", n, err)
	}
	if n, err := b.AckBatch(ctx, db); err != nil || n != 1 {
		t.Errorf("AckBatch of its own = %d, %v; want 1, nil: the refused batch acknowledged nothing", n, err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AckBatch(ctx, da); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("AckBatch after Close = %v, want idem.ErrClosed", err)
	}
	if _, err := a.NextBatch(ctx, 1); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("NextBatch after Close = %v, want idem.ErrClosed", err)
	}
}

// ProcessBatch records keys byte for byte, also those that are not UTF-8,
// and joins the transaction ctx carries.
func TestProcessBatchKeysAndCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	in, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"\xff\xfe", "a\x00b", "ünï", `"quoted",[json]`}
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		err := in.ProcessBatch(ctx, "c", keys, func(inner context.Context, fresh []bool) error {
			if !idemsqlite.CarriesTx(inner, db) {
				t.Error("fn's context carries no transaction: it should carry the caller's, which ProcessBatch joined")
			}
			if !slices.Equal(fresh, []bool{true, true, true, true}) {
				t.Errorf("fresh = %v, want all", fresh)
			}
			return nil
		})
		if err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	var fresh []bool
	if err := in.ProcessBatch(ctx, "c", keys, func(_ context.Context, f []bool) error { fresh = f; return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, []bool{true, true, true, true}) {
		t.Errorf("fresh = %v after the caller rolled back, want all", fresh)
	}
	for _, k := range keys {
		if err := in.Process(ctx, "c", k, func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("Process(%q) after ProcessBatch = %v, want idem.ErrDuplicate", k, err)
		}
	}
	if err := in.ProcessBatch(ctx, "c", []string{"new", keys[0]}, func(_ context.Context, f []bool) error { fresh = f; return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, []bool{true, false}) {
		t.Errorf("fresh = %v, want [true false]", fresh)
	}
}

// HeldBackKeys finds keys byte for byte, and in a transaction sees its
// holds.
func TestHeldBackKeysBytesAndTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	l, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.HoldBack(ctx, "c", "\xff", "dl-1"); err != nil {
		t.Fatal(err)
	}
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := l.HoldBack(ctx, "c", "acct-2", "dl-2"); err != nil {
			return err
		}
		got, err := l.HeldBackKeys(ctx, "c", []string{"\xff", "\xfe", "acct-2"})
		if err != nil {
			return err
		}
		if want := map[string]string{"\xff": "dl-1", "acct-2": "dl-2"}; !maps.Equal(got, want) {
			t.Errorf("HeldBackKeys in the transaction = %q, want %q", got, want)
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("WithTx did not roll back")
	}
	got, err := l.HeldBackKeys(ctx, "c", []string{"\xff", "acct-2"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"\xff": "dl-1"}; !maps.Equal(got, want) {
		t.Errorf("HeldBackKeys = %q, want %q", got, want)
	}
	if _, err := l.HeldBackKeys(ctx, "c", []string{"a", ""}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("HeldBackKeys with an empty key = %v, want idem.ErrInvalidArgument", err)
	}
}
