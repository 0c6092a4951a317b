package idemkafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka"
)

// A message published with its ID, consumed by a consumer group, and
// acknowledged: the offset is committed after the Ack, in the next batch of
// commits. An in-process kfake stands in for the brokers.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := idemkafka.Open(ctx, cluster.ListenAddrs(), &idemkafka.Config{})
	if err != nil {
		panic(err)
	}
	defer tr.Close()

	stream, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments.succeeded", Consumer: "settlement"})
	if err != nil {
		panic(err)
	}
	defer stream.Close()

	err = tr.Publish(ctx, idem.Message{
		ID:      "evt-1",
		Topic:   "payments.succeeded",
		Key:     "acct-7", // the Kafka key: acct-7's messages share a partition, in order
		Payload: []byte(`{"amount":1250}`),
	})
	if err != nil {
		panic(err)
	}
	d, err := stream.Next(ctx)
	if err != nil {
		panic(err)
	}
	m := d.Message()
	fmt.Println(m.ID, m.Key, string(m.Payload), d.Attempt())
	if err := d.Ack(ctx); err != nil {
		panic(err)
	}
	// Output: evt-1 acct-7 {"amount":1250} 1
}
