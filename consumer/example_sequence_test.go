package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

// An account's events carry the account's version, so the consumer
// de-duplicates by (account, version) and keeps one mark per account
// instead of one inbox row per message. A copy re-sent under a new message
// ID is a duplicate all the same, and version 4, arriving before version 3,
// is held back (handed back to the transport and retried) until version 3
// has been applied, so the balance moves in the account's order.
func Example_sequence() {
	ctx := context.Background()
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	balances := &idemmem.Counters{}

	c, err := consumer.New(&consumer.Config{
		Name:        "balances",
		Topic:       "accounts.changed",
		Subscriber:  transport,
		Inbox:       idemmem.NewInbox(), // an idem.SequenceInbox
		DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger:      idemmem.NewLedger(),
		InTx:        idemmem.Transact,
		Sequence: func(m idem.Message) (string, uint64, error) {
			var e struct {
				Account string `json:"account"`
				Version uint64 `json:"version"`
			}
			err := json.Unmarshal(m.Payload, &e)
			return e.Account, e.Version, err
		},
		Gap: idem.GapHold, // the default: wait for the missing versions
		// Retry a held version soon; the missing one is right behind it.
		Retry: idem.RetryPolicy{Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	event := func(id string, version uint64, amount int64) idem.Message {
		return idem.Message{
			ID: id, Topic: "accounts.changed", Key: "acct-1",
			Payload: fmt.Appendf(nil, `{"account":"acct-1","version":%d,"amount":%d}`, version, amount),
		}
	}
	_ = transport.Publish(ctx,
		event("m-1", 1, 100),
		event("m-2", 2, 50),
		event("m-9", 2, 50), // version 2 re-sent under another message ID
		event("m-4", 4, 10), // version 4 before version 3
		event("m-3", 3, -30),
	)

	var versions []uint64
	runUntil(c, func(ctx context.Context, m idem.Message) error {
		var e struct{ Amount int64 }
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			return idem.Permanent(err)
		}
		info, _ := consumer.InfoFromContext(ctx)
		versions = append(versions, info.Seq)
		// Joins the inbox's transaction: it commits with the new mark.
		return balances.Add(ctx, info.Aggregate, e.Amount)
	}, func(s consumer.Stats) bool { return s.Processed == 4 && s.Duplicates == 1 })

	s := c.Stats()
	fmt.Println("versions applied:", versions)
	fmt.Println("balance:", balances.Get("acct-1"))
	fmt.Println("duplicates:", s.Duplicates)
	fmt.Println("version 4 held for version 3:", s.Retried > 0)
	// Output:
	// versions applied: [1 2 3 4]
	// balance: 130
	// duplicates: 1
	// version 4 held for version 3: true
}

// Events that carry the final state with a version need no order: under
// idem.GapAllow a version older than the one applied is a duplicate, so
// the last state wins whatever the order of arrival, and Unordered lets a
// key's events overtake each other instead of waiting. Here "paid"
// (version 1) fails once, "refunded" (version 2) arrives and is applied
// while "paid" waits for its retry, and the retry is a duplicate: the
// refund stands. The clock is a manual one, so the retry comes exactly
// when the example moves it.
func ExampleConfig_unordered() {
	ctx := context.Background()
	clock := idemmem.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	transport := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock, Poll: time.Millisecond})
	defer transport.Close()
	status := make(map[string]string)

	c, err := consumer.New(&consumer.Config{
		Name:        "payment-status",
		Topic:       "payments.changed",
		Subscriber:  transport,
		Inbox:       idemmem.NewInbox(), // an idem.SequenceInbox
		DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger:      idemmem.NewLedger(),
		InTx:        idemmem.Transact,
		Sequence: func(m idem.Message) (string, uint64, error) {
			var e struct {
				Payment string `json:"payment"`
				Version uint64 `json:"version"`
			}
			err := json.Unmarshal(m.Payload, &e)
			return e.Payment, e.Version, err
		},
		Gap:       idem.GapAllow, // each event is the whole state: skipping is fine
		Unordered: true,          // so a key's events need not wait for each other
		Clock:     clock,
		Timers:    clock,
		// Longer than the minute the example moves the clock by, so that
		// the move redelivers nothing whose Ack is still on its way.
		AckWait: time.Hour,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	event := func(id string, version uint64, state string) idem.Message {
		return idem.Message{
			ID: id, Topic: "payments.changed", Key: "pay_1",
			Payload: fmt.Appendf(nil, `{"payment":"pay_1","version":%d,"status":%q}`, version, state),
		}
	}
	_ = transport.Publish(ctx, event("m-1", 1, "paid"))

	var mu sync.Mutex
	failed := false
	h := func(ctx context.Context, m idem.Message) error {
		var e struct{ Status string }
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			return idem.Permanent(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if e.Status == "paid" && !failed {
			failed = true
			return idem.RetryAfter(errors.New("database timeout"), time.Minute)
		}
		status["pay_1"] = e.Status // a real handler writes in the inbox's transaction
		return nil
	}
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(runCtx, h) }()
	waitStats := func(done func(consumer.Stats) bool) {
		for deadline := time.Now().Add(time.Minute); !done(c.Stats()) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	waitStats(func(s consumer.Stats) bool { return s.Retried == 1 }) // "paid" failed
	// "refunded" comes while "paid" waits for its retry, and is applied at
	// once: it need not wait behind "paid".
	_ = transport.Publish(ctx, event("m-2", 2, "refunded"))
	waitStats(func(s consumer.Stats) bool { return s.Processed == 1 })
	clock.Advance(time.Minute) // the retry of "paid" is due
	waitStats(func(s consumer.Stats) bool { return s.Duplicates == 1 })
	cancel()
	<-stopped

	mu.Lock()
	defer mu.Unlock()
	fmt.Println("status:", status["pay_1"])
	fmt.Println("late paid was a duplicate:", c.Stats().Duplicates == 1)
	// Output:
	// status: refunded
	// late paid was a duplicate: true
}
