// This file runs every conformance suite of idemtest that idemamqp
// qualifies for; the package's own tests are in the other files.
//
// Passes: TestTransport (Transport, on quorum queues and on classic ones)
// and TestPerKeyOrder (the consumer over the Transport).
//
// Does not implement: TestStore, TestTxEffects, TestInbox, TestOutbox,
// TestDeadLetters, TestLedger and TestOutboxMover (a transport only: it
// keeps no keys, inbox, outbox, dead letters or ledger).

package idemamqp_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemtest"
)

var quorumFeatures = idemtest.TransportFeatures{
	DelayedNack:      true,
	AttemptCount:     true,
	CountsPrefetched: true,
	Term:             true,
	OrderedPerTopic:  true,
	RealTime:         true,
}

func TestTransport(t *testing.T) {
	t.Parallel()
	amqpURL(t)
	idemtest.TestTransport(t, quorumFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := newIsolated(t, idemamqp.Config{Clock: clock})
		return tr, tr
	})
}

// Classic queues keep no delivery count: Attempt is a lower bound.
func TestTransportClassic(t *testing.T) {
	t.Parallel()
	amqpURL(t)
	f := quorumFeatures
	f.AttemptCount = false
	idemtest.TestTransport(t, f, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := newIsolated(t, idemamqp.Config{Clock: clock, ClassicQueues: true})
		return tr, tr
	})
}

// The consumer keeps each key's order across retries through RabbitMQ:
// 10,000 messages over 100 keys, a quarter of early attempts failing.
// RabbitMQ delivers the copies published under one ID, and the inbox must
// catch them.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	// Mandatory, so that a message routed to no queue fails the test
	// instead of vanishing.
	tr := newIsolated(t, idemamqp.Config{Mandatory: true})
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{
		CopiesDelivered: true,
		// The queue exists, bound to the topic, before anything is
		// published: RabbitMQ routes only to the queues that exist, and
		// the consumer subscribes in its own time.
		BeforePublish: func(t *testing.T) {
			pre, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "payments.succeeded", Consumer: "settlement"})
			if err != nil {
				t.Fatalf("Subscribe: %v", err)
			}
			if err := pre.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		},
	})
}
