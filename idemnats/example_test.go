package idemnats_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemnats"
)

// exampleName tells the example's stream and subjects apart from any other
// run's: the tests of two checkouts may share one server, and JetStream
// refuses two streams over the same subjects.
var exampleName = rand.Text()

// A payment event is published with its event ID as Nats-Msg-Id, consumed
// by a durable consumer, handed back once with a delay, and acknowledged on
// its second attempt. It needs a NATS server with JetStream at
// IDEM_NATS_URL (default nats://127.0.0.1:4222), so it has no Output
// comment; TestExample runs it, gated, and checks what it prints:
//
//	evt-1 acct-1 attempt 1
//	evt-1 attempt 2
func Example() {
	url := os.Getenv("IDEM_NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	ctx := context.Background()
	cfg := &idemnats.Config{Stream: "IDEM_EXAMPLE_" + exampleName, SubjectPrefix: "idemexample" + exampleName}
	tr, err := idemnats.Open(ctx, url, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tr.Close()
	defer deleteStream(url, cfg.Stream)

	stream, err := tr.Subscribe(ctx, idem.Subscription{
		Topic:    "payments.succeeded", // subject idemexample<exampleName>.payments.succeeded
		Consumer: "settlement",
		AckWait:  30 * time.Second,
	})
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

	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := stream.Next(wait)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Message().ID, d.Message().Key, "attempt", d.Attempt())
	// A transient failure: the server redelivers it after the delay.
	if err := d.Nack(ctx, 100*time.Millisecond); err != nil {
		fmt.Println(err)
		return
	}

	d, err = stream.Next(wait)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Message().ID, "attempt", d.Attempt())
	if err := d.Ack(ctx); err != nil {
		fmt.Println(err)
	}
}

func deleteStream(url, name string) {
	nc, err := nats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	if js, err := jetstream.New(nc); err == nil {
		_ = js.DeleteStream(context.Background(), name)
	}
}
