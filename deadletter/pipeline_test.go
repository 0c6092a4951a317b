package deadletter_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/eventually"
	"github.com/idem-go/idem/outbox"
)

// TestRedriveThroughThePipeline runs the whole loop on the in-memory
// stores: a relay publishes from the outbox, the consumer dead-letters a
// message and parks the later ones of its key, the service re-drives it,
// and the consumer applies the key's messages once each, in order.
func TestRedriveThroughThePipeline(t *testing.T) {
	t.Parallel()
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	letters, ledger, ob := idemmem.NewDeadLetters(nil), idemmem.NewLedger(), idemmem.NewOutbox(nil)

	relay, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: transport, Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(&consumer.Config{
		Name: "settlement", Topic: "payments.succeeded", Subscriber: transport,
		Inbox: idemmem.NewInbox(), DeadLetters: letters, Ledger: ledger, InTx: idemmem.Transact,
	})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := deadletter.New(&deadletter.Config{DeadLetters: letters, Ledger: ledger, Outbox: ob, InTx: idemmem.Transact})
	if err != nil {
		t.Fatal(err)
	}

	var broken atomic.Bool
	broken.Store(true)
	var mu sync.Mutex
	var applied []string
	handler := func(ctx context.Context, m idem.Message) error {
		if m.ID == "evt-1" && broken.Load() {
			return idem.Permanent(errors.New("unknown payment"))
		}
		tx, _ := idemmem.TxFromContext(ctx)
		return tx.OnCommit(func() {
			mu.Lock()
			defer mu.Unlock()
			applied = append(applied, m.ID)
		})
	}
	appliedNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(applied)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := relay.Run(ctx); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	wg.Go(func() {
		if err := c.Run(ctx, handler); err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()

	if err := ob.Add(context.Background(),
		message("evt-1", "acct-1"), message("evt-2", "acct-1"), message("evt-3", "acct-1"), message("evt-4", "acct-2"),
	); err != nil {
		t.Fatal(err)
	}
	relay.Wake()
	waitFor(t, "evt-1 dead-lettered and evt-2, evt-3 parked", func() bool {
		s := c.Stats()
		return s.DeadLettered == 1 && s.Parked == 2 && s.Processed == 1
	})
	if got := appliedNow(); !slices.Equal(got, []string{"evt-4"}) {
		t.Fatalf("applied %v before the redrive, want [evt-4]", got)
	}

	broken.Store(false)
	dls, err := svc.List(context.Background(), idem.DeadLetterFilter{Consumer: "settlement", State: idem.LetterDead})
	if err != nil || len(dls) != 1 {
		t.Fatalf("List: %+v, %v", dls, err)
	}
	if _, err := svc.Redrive(context.Background(), []string{dls[0].ID}, &deadletter.RedriveOptions{Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	relay.Wake()
	waitFor(t, "the key's messages applied", func() bool { return len(appliedNow()) >= 4 })
	if got, want := appliedNow(), []string{"evt-4", "evt-1", "evt-2", "evt-3"}; !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, 10*time.Second, what, cond)
}
