package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
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
