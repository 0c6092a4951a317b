package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

// runUntil runs c until done reports true (or a minute passes), then stops
// it.
func runUntil(c *consumer.Consumer, h consumer.Handler, done func(consumer.Stats) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx, h) }()
	for deadline := time.Now().Add(time.Minute); !done(c.Stats()) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-stopped; err != nil {
		fmt.Println("run:", err)
	}
}

// An increment is not idempotent: only the inbox keeps a message delivered
// twice, or re-published under another ID, from being counted twice. The
// dedup key is the event ID in the body, so the copy is caught too.
func Example() {
	ctx := context.Background()
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	totals := &idemmem.Counters{}

	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       "payments.succeeded",
		Subscriber:  transport,
		Inbox:       idemmem.NewInbox(),
		DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger:      idemmem.NewLedger(),
		InTx:        idemmem.Transact,
		DedupKey: func(m idem.Message) (string, error) {
			var e struct {
				EventID string `json:"event_id"`
			}
			err := json.Unmarshal(m.Payload, &e)
			return e.EventID, err
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	event := func(id, eventID string, amount int) idem.Message {
		return idem.Message{
			ID: id, Topic: "payments.succeeded", Key: "tenant-1",
			Payload: fmt.Appendf(nil, `{"event_id":%q,"amount":%d}`, eventID, amount),
		}
	}
	_ = transport.Publish(ctx,
		event("m-1", "evt-1", 1250),
		event("m-1", "evt-1", 1250), // delivered twice
		event("m-2", "evt-2", 500),
		event("m-3", "evt-1", 1250), // re-published under another ID
	)

	runUntil(c, func(ctx context.Context, m idem.Message) error {
		var e struct{ Amount int64 }
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			return idem.Permanent(err)
		}
		// Joins the inbox's transaction: counted only if it commits.
		return totals.Add(ctx, "tenant-1", e.Amount)
	}, func(s consumer.Stats) bool { return s.Processed+s.Duplicates == 4 })

	s := c.Stats()
	fmt.Println("total:", totals.Get("tenant-1"))
	fmt.Println("processed:", s.Processed, "duplicates:", s.Duplicates)
	// Output:
	// total: 1750
	// processed: 2 duplicates: 2
}

// A message that can never succeed is dead-lettered after one attempt,
// with the original message and why; the later messages of its key are
// parked behind it, in order, until it is re-driven or discarded.
func Example_deadLetter() {
	ctx := context.Background()
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	deadLetters := idemmem.NewDeadLetters(nil)
	ledger := idemmem.NewLedger()

	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       "payments.succeeded",
		Subscriber:  transport,
		Inbox:       idemmem.NewInbox(),
		DeadLetters: deadLetters,
		Ledger:      ledger,
		InTx:        idemmem.Transact,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = transport.Publish(ctx,
		idem.Message{ID: "m-1", Topic: "payments.succeeded", Key: "pay_1", Payload: []byte(`{"payment_id":"pay_404"}`)},
		idem.Message{ID: "m-2", Topic: "payments.succeeded", Key: "pay_1", Payload: []byte(`{"payment_id":"pay_404"}`)},
	)
	runUntil(c, func(ctx context.Context, m idem.Message) error {
		return idem.Permanent(errors.New("unknown payment pay_404"))
	}, func(s consumer.Stats) bool { return s.DeadLettered == 1 && s.Parked == 1 })

	letters, _ := deadLetters.List(ctx, idem.DeadLetterFilter{Consumer: "settlement"})
	for _, dl := range letters {
		fmt.Printf("%s %s: %s after %d attempt(s): %s\n", dl.ID, dl.Message.ID, dl.Class, len(dl.Attempts), dl.LastError())
	}
	parked, _ := ledger.LetGo(ctx, "settlement", "pay_1")
	for _, m := range parked {
		fmt.Println("parked:", m.ID)
	}
	// Output:
	// dl-1 m-1: permanent after 1 attempt(s): unknown payment pay_404
	// parked: m-2
}

// A transient error is retried with backoff; the handler can read which
// attempt it is.
func ExampleInfoFromContext() {
	ctx := context.Background()
	transport := idemmem.NewTransport(&idemmem.TransportConfig{Poll: time.Millisecond})
	defer transport.Close()
	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       "payments.succeeded",
		Subscriber:  transport,
		Inbox:       idemmem.NewInbox(),
		DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger:      idemmem.NewLedger(),
		Retry:       idem.RetryPolicy{Base: time.Millisecond, Cap: 5 * time.Millisecond},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = transport.Publish(ctx, idem.Message{ID: "m-1", Topic: "payments.succeeded", Key: "pay_1"})
	runUntil(c, func(ctx context.Context, m idem.Message) error {
		info, _ := consumer.InfoFromContext(ctx)
		if info.Attempt <= 3 {
			return errors.New("ledger service unavailable")
		}
		fmt.Println("settled on attempt", info.Attempt)
		return nil
	}, func(s consumer.Stats) bool { return s.Processed == 1 })
	fmt.Println("retried:", c.Stats().Retried)
	// Output:
	// settled on attempt 4
	// retried: 3
}

// A BatchHandler applies a whole batch in one call, inside the batch's inbox
// transaction: here one addition per tenant, however many events the batch
// holds. A message it cannot apply is named with an ItemError, and the rest
// of the batch is applied without it.
func ExampleConsumer_RunBatch() {
	ctx := context.Background()
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	totals := &idemmem.Counters{}
	letters := idemmem.NewDeadLetters(nil)
	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       "payments.succeeded",
		Subscriber:  transport,
		Inbox:       idemmem.NewInbox(),
		DeadLetters: letters,
		Ledger:      idemmem.NewLedger(),
		InTx:        idemmem.Transact,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, amount := range []int{1250, 500, -1, 750} {
		_ = transport.Publish(ctx, idem.Message{
			ID: fmt.Sprintf("evt-%d", i), Topic: "payments.succeeded", Key: fmt.Sprintf("acct-%d", i),
			Payload: fmt.Appendf(nil, `{"tenant":"t1","amount":%d}`, amount),
		})
	}
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() {
		stopped <- c.RunBatch(ctx, func(ctx context.Context, msgs []idem.Message) error {
			sums := make(map[string]int64)
			for i, m := range msgs {
				var e struct {
					Tenant string
					Amount int64
				}
				if err := json.Unmarshal(m.Payload, &e); err != nil || e.Amount <= 0 {
					return &consumer.ItemError{Index: i, Err: idem.Permanent(fmt.Errorf("bad amount in %s", m.ID))}
				}
				sums[e.Tenant] += e.Amount
			}
			for tenant, sum := range sums {
				if err := totals.Add(ctx, tenant, sum); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if s := c.Stats(); s.Processed == 3 && s.DeadLettered == 1 {
			break
		}
	}
	cancel()
	<-stopped
	dls, _ := letters.List(context.Background(), idem.DeadLetterFilter{})
	fmt.Println("total:", totals.Get("t1"))
	fmt.Println("dead letter:", dls[0].Message.ID, dls[0].LastError())
	// Output:
	// total: 2500
	// dead letter: evt-2 bad amount in evt-2
}

// NoInbox records nothing, so a message delivered twice runs the handler
// twice: fine for an effect that sets a state, as here, and wrong for one
// that adds, which needs an inbox.
func ExampleNoInbox() {
	ctx := context.Background()
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	c, err := consumer.New(&consumer.Config{
		Name:        "email",
		Topic:       "customers.changed",
		Subscriber:  transport,
		Inbox:       consumer.NoInbox{},
		DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger:      idemmem.NewLedger(),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	m := idem.Message{ID: "m-1", Topic: "customers.changed", Key: "cus_1", Payload: []byte(`{"email":"a@b.com"}`)}
	_ = transport.Publish(ctx, m, m) // delivered twice

	var email string
	runs := 0
	runUntil(c, func(ctx context.Context, m idem.Message) error {
		var e struct{ Email string }
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			return idem.Permanent(err)
		}
		runs++
		email = e.Email // setting: the same result however often it runs
		return nil
	}, func(s consumer.Stats) bool { return s.Processed == 2 })
	fmt.Println("handler runs:", runs)
	fmt.Println("email:", email)
	// Output:
	// handler runs: 2
	// email: a@b.com
}
