package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// renewer subscribes with an AckWait of a minute, publishes n messages
// and takes them.
func renewer(t *testing.T, tr *idempg.Transport, n int) (idem.BatchRenewer, []idem.Delivery) {
	t.Helper()
	s := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "c", AckWait: time.Minute})
	for i := range n {
		if err := tr.Publish(t.Context(), idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	ds := make([]idem.Delivery, n)
	for i := range ds {
		ds[i] = nextDelivery(t, s)
	}
	return s.(idem.BatchRenewer), ds
}

// InProgressBatch neither waits for a queue row another transaction holds
// locked (a settlement in flight: the heartbeat would otherwise hold the
// rows it renewed while it waited, and could close a cycle with a
// transaction that settles several) nor reports it stale: that settlement
// decides it. The others of the call are renewed.
func TestTransportInProgressBatchPassesOverALockedRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := transportDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, db, idempg.TransportConfig{Clock: clock})
	s, ds := renewer(t, tr, 3)
	clock.Advance(45 * time.Second)
	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(txCtx context.Context, _ pgx.Tx) error {
		if err := ds[1].Ack(txCtx); err != nil {
			return err
		}
		// Outside the transaction, which holds m-1's row locked.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		stale, err := s.InProgressBatch(rctx, ds)
		if err != nil || len(stale) != 0 {
			t.Errorf("InProgressBatch while a transaction holds m-1's row = %v, %v; want nothing stale, at once", stale, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	// Past the first AckWait: m-1 comes again, its Ack rolled back and its
	// renewal passed over; m-0 and m-2 were renewed.
	clock.Advance(16 * time.Second)
	if d := nextDelivery(t, s); d.Message().ID != "m-1" || d.Attempt() != 2 {
		t.Fatalf("Next after the first AckWait = %q attempt %d, want m-1 attempt 2", d.Message().ID, d.Attempt())
	}
	nctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := s.Next(nctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next = %v, %v; want nothing: m-0 and m-2 were renewed", d, err)
	}
}

// InProgressBatch joins the transaction ctx carries, as InProgress does:
// rolled back, it renewed nothing.
func TestTransportInProgressBatchJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := transportDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, db, idempg.TransportConfig{Clock: clock})
	s, ds := renewer(t, tr, 2)
	clock.Advance(45 * time.Second)
	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(txCtx context.Context, _ pgx.Tx) error {
		if stale, err := s.InProgressBatch(txCtx, ds); err != nil || len(stale) != 0 {
			t.Errorf("InProgressBatch in a transaction = %v, %v; want nothing stale", stale, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	clock.Advance(16 * time.Second)
	for _, want := range []string{"m-0", "m-1"} {
		if d := nextDelivery(t, s); d.Message().ID != want || d.Attempt() != 2 {
			t.Fatalf("Next after the first AckWait = %q attempt %d, want %q attempt 2: the rolled-back renewal must not hold it", d.Message().ID, d.Attempt(), want)
		}
	}
}
