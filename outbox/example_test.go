package outbox_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/outbox"
)

func Example() {
	ctx := context.Background()
	ob := idemmem.NewOutbox(nil)
	transport := idemmem.NewTransport(nil)
	defer transport.Close()

	// The event is written in the transaction of the effect it announces.
	err := idemmem.Transact(ctx, func(ctx context.Context) error {
		// … the payment's own writes …
		return ob.Add(ctx, idem.Message{ID: "evt-1", Topic: "payments.succeeded", Payload: []byte(`{"amount":1250}`)})
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	relay, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: transport, Name: "relay-1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Run(ctx) would repeat passes until cancelled; one pass suffices here.
	n, err := relay.Flush(ctx)
	fmt.Println("published:", n, err, "unsent:", ob.Unsent())

	s, _ := transport.Subscribe(ctx, idem.Subscription{Topic: "payments.succeeded", Consumer: "settlement"})
	defer s.Close()
	d, _ := s.Next(ctx)
	fmt.Println(d.Message().ID, string(d.Message().Payload))
	// Output:
	// published: 1 <nil> unsent: 0
	// evt-1 {"amount":1250}
}
