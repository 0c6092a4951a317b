// This file runs every conformance suite of idemtest that idemkafka
// qualifies for, against kfake started by the tests; the package's own
// tests are in the other files.
//
// Passes: TestTransport (with the features Kafka has) and TestPerKeyOrder
// (the consumer over the Transport).
//
// Does not implement: TestStore, TestTxEffects, TestInbox, TestOutbox,
// TestDeadLetters, TestLedger and TestOutboxMover (a transport only: it
// keeps no keys, inbox, outbox, dead letters or ledger).

package idemkafka_test

import (
	"time"

	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemtest"
)

// features are Kafka's. It lacks:
//   - AttemptCount: Kafka keeps no delivery count; a stream counts its own
//     deliveries, and the consumer's Ledger counts across restarts;
//   - AckWait and InProgress: a partition's records are held by one group
//     member until it settles them, closes or loses the partition; nothing
//     is redelivered on a timer.
//
// OrderedPerTopic holds per partition: the suite's topics have one.
var features = idemtest.TransportFeatures{
	DelayedNack:     true,
	Term:            true,
	OrderedPerTopic: true,
	RealTime:        true,
	Tick:            250 * time.Millisecond,
}

func TestTransport(t *testing.T) {
	t.Parallel()
	seeds := startKafka(t)
	idemtest.TestTransport(t, features, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		// A prefix, which the round trip checks is taken off again.
		tr := open(t, seeds, idemkafka.Config{Clock: clock, Partitions: 1, TopicPrefix: "svc."})
		return tr, tr
	})
}

// The consumer keeps each key's order across retries through Kafka:
// 10,000 messages over 100 keys on 8 partitions, a quarter of early
// attempts failing. Kafka keeps the copies published under one ID, and
// the inbox must catch them.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	tr := open(t, startKafka(t), idemkafka.Config{})
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{CopiesDelivered: true})
}
