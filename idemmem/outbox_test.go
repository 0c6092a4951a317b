package idemmem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func TestOutboxJoinsTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	o := idemmem.NewOutbox(nil)
	var balance idemmem.Counters
	boom := errors.New("payment failed")
	msg := func(id string) idem.Message { return idem.Message{ID: id, Topic: "payments.succeeded"} }

	_ = idemmem.Transact(ctx, func(ctx context.Context) error {
		_ = balance.Add(ctx, "acct-1", 1250)
		_ = o.Add(ctx, msg("evt-rolled-back"))
		return boom
	})
	// Added after the first, committed before the second: Seq follows
	// commit order.
	err := idemmem.Transact(ctx, func(ctx context.Context) error {
		if err := balance.Add(ctx, "acct-1", 700); err != nil {
			return err
		}
		if err := o.Add(ctx, msg("evt-2")); err != nil {
			return err
		}
		return idemmem.Transact(ctx, func(ctx context.Context) error { return o.Add(ctx, msg("evt-3")) })
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Add(ctx, msg("evt-4")); err != nil { // no Tx: at once
		t.Fatal(err)
	}
	got, err := o.Claim(ctx, "r", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range got {
		ids = append(ids, e.Message.ID)
	}
	if len(ids) != 3 || ids[0] != "evt-2" || ids[1] != "evt-3" || ids[2] != "evt-4" || balance.Get("acct-1") != 700 {
		t.Errorf("outbox %v, balance %d; want [evt-2 evt-3 evt-4], 700", ids, balance.Get("acct-1"))
	}
	if o.Unsent() != 3 {
		t.Errorf("Unsent = %d, want 3", o.Unsent())
	}
	_ = o.MarkSent(ctx, got[0].Seq, got[1].Seq, got[2].Seq)
	if o.Unsent() != 0 {
		t.Errorf("Unsent after MarkSent = %d, want 0", o.Unsent())
	}
}

func TestOutboxCancelledClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := idemmem.NewOutbox(nil).Claim(ctx, "r", 1, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim(cancelled) = %v, want context.Canceled", err)
	}
}

func TestOutboxBacklog(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(start)
	o := idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock})
	ctx := context.Background()
	if n, oldest, err := o.Backlog(ctx); n != 0 || !oldest.IsZero() || err != nil {
		t.Fatalf("empty: %d %v %v", n, oldest, err)
	}
	if err := o.Add(ctx, idem.Message{ID: "e-1", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := o.Add(ctx, idem.Message{ID: "e-2", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if n, oldest, err := o.Backlog(ctx); n != 2 || !oldest.Equal(start) || err != nil {
		t.Fatalf("two waiting: %d %v %v; want 2 and %v", n, oldest, err, start)
	}
	got, err := o.Claim(ctx, "r", 1, time.Minute)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	if err := o.MarkSent(ctx, got[0].Seq); err != nil {
		t.Fatal(err)
	}
	if n, oldest, err := o.Backlog(ctx); n != 1 || !oldest.Equal(start.Add(time.Second)) || err != nil {
		t.Fatalf("one sent: %d %v %v", n, oldest, err)
	}
}
