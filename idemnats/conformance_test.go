// This file runs every conformance suite of idemtest that idemnats
// qualifies for; the package's own tests are in the other files.
//
// Passes: TestTransport (Transport, with the features JetStream has) and
// TestPerKeyOrder (the consumer over the Transport).
//
// Does not implement: TestStore, TestTxEffects, TestInbox, TestOutbox,
// TestDeadLetters, TestLedger and TestOutboxMover (a transport only: it
// keeps no keys, inbox, outbox, dead letters or ledger).

package idemnats_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idemtest"
)

var features = idemtest.TransportFeatures{
	DelayedNack:     true,
	AttemptCount:    true,
	AckWait:         true,
	InProgress:      true,
	Term:            true,
	OrderedPerTopic: true,
	RealTime:        true,
}

func TestTransport(t *testing.T) {
	t.Parallel()
	natsURL(t)
	idemtest.TestTransport(t, features, func(t *testing.T, _ idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := newIsolated(t, idemnats.Config{})
		return tr, tr
	})
}

// The consumer keeps each key's order across retries through JetStream:
// 10,000 messages over 100 keys, a quarter of early attempts failing.
// JetStream drops the copies published under an ID it has stored.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{})
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{})
}
