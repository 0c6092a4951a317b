package idemmem_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// A message is published, consumed and acknowledged; one that fails is
// handed back with a delay and comes again as attempt 2.
func ExampleTransport() {
	ctx := context.Background()
	tr := idemmem.NewTransport(nil)
	defer tr.Close()

	stream, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments.succeeded", Consumer: "settlement"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stream.Close()

	err = tr.Publish(ctx, idem.Message{
		ID:      "evt-1",
		Topic:   "payments.succeeded",
		Key:     "acct-1",
		Payload: []byte(`{"event_id":"evt-1","amount":1250}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	d, err := stream.Next(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Message().ID, "attempt", d.Attempt(), string(d.Message().Payload))
	// The handler failed transiently: try again shortly.
	_ = d.Nack(ctx, 10*time.Millisecond)

	d, err = stream.Next(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Message().ID, "attempt", d.Attempt())
	// Applied: the transport forgets it.
	_ = d.Ack(ctx)
	// Output:
	// evt-1 attempt 1 {"event_id":"evt-1","amount":1250}
	// evt-1 attempt 2
}
