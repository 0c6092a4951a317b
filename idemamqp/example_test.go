package idemamqp_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
)

// exampleName names the example's exchange and queues, apart from any other
// run's: the tests of two checkouts may share one broker, and two consumers
// of one queue would each take the other's messages.
var exampleName = "idem.example." + strings.ToLower(rand.Text())

// A payment event is published with a publisher confirm, consumed from the
// consumer's quorum queue, handed back once with a delay (through a delay
// queue) and acknowledged on its second attempt. It needs RabbitMQ at
// IDEM_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), so it has no
// Output comment; TestExample runs it, gated, and checks what it prints:
//
//	evt-1 acct-1 attempt 1
//	evt-1 payments.succeeded attempt 2
func Example() {
	url := os.Getenv("IDEM_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx := context.Background()
	tr, err := idemamqp.Open(ctx, url, &idemamqp.Config{Exchange: exampleName, QueuePrefix: exampleName})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tr.Close()
	// The example cleans up after itself; a service keeps its queues.
	defer tr.DeleteQueues(ctx)

	// Subscribing declares queue <exampleName>.settlement, bound to the
	// topic: RabbitMQ routes only to the queues that exist.
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

	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d, err := stream.Next(wait)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Message().ID, d.Message().Key, "attempt", d.Attempt())
	// A transient failure: the message comes back after the delay.
	if err := d.Nack(ctx, 100*time.Millisecond); err != nil {
		fmt.Println(err)
		return
	}

	d, err = stream.Next(wait)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Message().ID, d.Message().Topic, "attempt", d.Attempt())
	if err := d.Ack(ctx); err != nil {
		fmt.Println(err)
	}
}
