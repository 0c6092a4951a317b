package deadletter_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemmem"
)

// exampleStores returns in-memory stores holding one dead letter of the
// settlement consumer for key acct-1, with a later message of the key
// parked behind it, as the consumer leaves them.
func exampleStores() (*idemmem.DeadLetters, *idemmem.Ledger, *idemmem.Outbox, *idemmem.Clock, string) {
	ctx := context.Background()
	clock := idemmem.NewClock(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	letters := idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock})
	ledger := idemmem.NewLedger()
	outbox := idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock})
	failed := idem.Message{ID: "evt-1", Topic: "payments.succeeded", Key: "acct-1", Payload: []byte(`{"event_id":"evt-1","amount":1250}`)}
	var id string
	_ = idemmem.Transact(ctx, func(ctx context.Context) error {
		id, _ = letters.Add(ctx, idem.DeadLetter{
			Consumer: "settlement", Message: failed, Class: idem.DeadPermanent,
			Attempts:      []idem.Attempt{{Number: 1, At: clock.Now(), Class: idem.ClassPermanent, Error: "unknown payment"}},
			FirstFailedAt: clock.Now(), LastFailedAt: clock.Now(),
		})
		return ledger.HoldBack(ctx, "settlement", "acct-1", id)
	})
	_ = ledger.Park(ctx, "settlement", idem.Message{ID: "evt-2", Topic: "payments.succeeded", Key: "acct-1"})
	clock.Advance(time.Hour)
	return letters, ledger, outbox, clock, id
}

func ExampleService_Redrive() {
	ctx := context.Background()
	letters, ledger, outbox, clock, id := exampleStores()
	svc, err := deadletter.New(&deadletter.Config{
		DeadLetters: letters, Ledger: ledger, Outbox: outbox,
		InTx: idemmem.Transact, Clock: clock,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// What would happen?
	res, _ := svc.Redrive(ctx, []string{id}, &deadletter.RedriveOptions{Actor: "alice", DryRun: true})
	fmt.Println("dry run:", res[0].Message.ID, "then", len(res[0].Released), "released; outbox:", outbox.Unsent())

	// Do it.
	res, err = svc.Redrive(ctx, []string{id}, &deadletter.RedriveOptions{Actor: "alice", Reason: "payment imported"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res[0].Letter.State, "outbox:", outbox.Unsent())
	entries, _ := outbox.Claim(ctx, "relay", 10, time.Minute)
	for _, e := range entries {
		fmt.Println(e.Seq, e.Message.ID)
	}

	// Again: refused, nothing changes.
	_, err = svc.Redrive(ctx, []string{id}, &deadletter.RedriveOptions{Actor: "alice"})
	fmt.Println(err)
	// Output:
	// dry run: evt-1 then 1 released; outbox: 0
	// redriven outbox: 2
	// 1 evt-1
	// 2 evt-2
	// deadletter: redrive "dl-1": it is redriven, not dead: idem: invalid dead-letter transition
}

func ExampleService_Discard() {
	ctx := context.Background()
	letters, ledger, outbox, clock, id := exampleStores()
	svc, _ := deadletter.New(&deadletter.Config{DeadLetters: letters, Ledger: ledger, Outbox: outbox, InTx: idemmem.Transact, Clock: clock})

	_, err := svc.Discard(ctx, []string{id}, "bob", "")
	fmt.Println(err)
	res, _ := svc.Discard(ctx, []string{id}, "bob", "test payment, never settled")
	fmt.Println(res[0].Letter.State, "released:", res[0].Released[0].ID)
	// Output:
	// idem: invalid reason: must not be empty: say why the message is given up
	// discarded released: evt-2
}

func ExampleRender() {
	letters, _, _, _, id := exampleStores()
	dl, _ := letters.Get(context.Background(), id)
	_ = deadletter.Render(os.Stdout, dl)
	// Output:
	// Dead letter   dl-1
	// State         dead
	// Consumer      settlement
	// Class         permanent
	// Message ID    evt-1
	// Topic         payments.succeeded
	// Key           acct-1
	// Published     (unknown)
	// First failed  2026-03-04 05:06:07.000Z
	// Last failed   2026-03-04 05:06:07.000Z
	// Attempts      1
	// Last error    unknown payment
	//
	// Payload (JSON, 34 bytes)
	//   {
	//     "event_id": "evt-1",
	//     "amount": 1250
	//   }
	//
	// Headers
	//   (none)
	//
	// Attempts
	//   2026-03-04 05:06:07.000Z    #1  permanent  unknown payment
	//
	// History
	//   2026-03-04 05:06:07.000Z  dead-lettered  by settlement  -> dead  reason: unknown payment
}
