package idempg_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
)

func TestOutboxBacklog(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	o, err := idempg.NewOutbox(ctx, messagesDB(t), &idempg.OutboxConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	n, oldest, err := o.Backlog(ctx)
	if err != nil || n != 0 || !oldest.IsZero() {
		t.Fatalf("empty outbox: Backlog = %d, %v, %v; want 0, zero time, nil", n, oldest, err)
	}
	first := clock.Now()
	if err := o.Add(ctx, idem.Message{ID: "a", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := o.Add(ctx, idem.Message{ID: "b", Topic: "t"}, idem.Message{ID: "c", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	claimed, err := o.Claim(ctx, "relay", 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("Claim = %v, %v", claimed, err)
	}
	// A leased entry still waits: only MarkSent takes it out.
	if n, oldest, err = o.Backlog(ctx); err != nil || n != 3 || !oldest.Equal(first) {
		t.Fatalf("Backlog = %d, %v, %v; want 3, %v, nil", n, oldest, err, first)
	}
	if err := o.MarkSent(ctx, claimed[0].Seq); err != nil {
		t.Fatal(err)
	}
	if n, oldest, err = o.Backlog(ctx); err != nil || n != 2 || !oldest.Equal(first.Add(time.Second)) {
		t.Fatalf("after MarkSent: Backlog = %d, %v, %v; want 2, %v, nil", n, oldest, err, first.Add(time.Second))
	}
}
