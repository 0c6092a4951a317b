package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// InProgressBatch joins the transaction ctx carries, as InProgress does:
// rolled back, it renewed nothing; on its own, it renews.
func TestTransportInProgressBatchJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, db, clock)
	s, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "c", AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for i := range 3 {
		if err := tr.Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	ds := []idem.Delivery{next(t, s), next(t, s), next(t, s)}
	br := s.(idem.BatchRenewer)
	clock.Advance(45 * time.Second)
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(txCtx context.Context, _ *sql.Tx) error {
		if stale, err := br.InProgressBatch(txCtx, ds[:2]); err != nil || len(stale) != 0 {
			t.Errorf("InProgressBatch in a transaction = %v, %v; want nothing stale", stale, err)
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if stale, err := br.InProgressBatch(ctx, ds[2:]); err != nil || len(stale) != 0 {
		t.Fatalf("InProgressBatch = %v, %v; want nothing stale", stale, err)
	}
	clock.Advance(16 * time.Second)
	for _, want := range []string{"m-0", "m-1"} {
		if d := next(t, s); d.Message().ID != want || d.Attempt() != 2 {
			t.Fatalf("Next after the first AckWait = %q attempt %d, want %q attempt 2: the rolled-back renewal must not hold it", d.Message().ID, d.Attempt(), want)
		}
	}
	nctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := s.Next(nctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next = %v, %v; want nothing: m-2 was renewed", d, err)
	}
}
