// This file runs every conformance suite of idemtest that idemmem
// qualifies for; the package's own tests are in the other files.
//
// Passes: TestStore (Store), TestInbox (Inbox), TestOutbox (Outbox),
// TestDeadLetters (DeadLetters), TestLedger (Ledger), and TestTransport
// (Transport) on the suite's manual clock and again in real time.
//
// Does not implement: TestTxEffects (the Store is no idem.TxStore: its
// records share no transaction with an effect) and TestOutboxMover (the
// Transport has no MoveOutbox). TestPerKeyOrder runs on these types in
// idemtest's own tests (TestPerKeyOrderOnMemory), not here.

package idemmem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return idemmem.NewStore(&idemmem.Config{Clock: clock})
	})
}

// counterEffects are the suite's InboxEffects on Counters. Write refuses a
// context without a Tx, so an inbox that did not give fn one would fail.
type counterEffects struct{ c *idemmem.Counters }

func (e counterEffects) Write(ctx context.Context, tag string) error {
	if _, ok := idemmem.TxFromContext(ctx); !ok {
		return errors.New("no idemmem.Tx in the context")
	}
	return e.c.Add(ctx, tag, 1)
}

func (e counterEffects) Count(_ context.Context, tag string) (int, error) {
	return int(e.c.Get(tag)), nil
}

func TestInbox(t *testing.T) {
	t.Parallel()
	idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
		return idemmem.NewInbox(), counterEffects{&idemmem.Counters{}}
	})
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	idemtest.TestOutbox(t, func(t *testing.T, clock idem.Clock) idem.Outbox {
		return idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock})
	})
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	idemtest.TestDeadLetters(t, func(t *testing.T, clock idem.Clock) idem.DeadLetters {
		return idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock})
	})
}

func TestLedger(t *testing.T) {
	t.Parallel()
	idemtest.TestLedger(t, func(t *testing.T) idem.Ledger { return idemmem.NewLedger() })
}

var allFeatures = idemtest.TransportFeatures{
	DelayedNack:     true,
	AttemptCount:    true,
	AckWait:         true,
	InProgress:      true,
	Term:            true,
	OrderedPerTopic: true,
}

func TestTransport(t *testing.T) {
	t.Parallel()
	idemtest.TestTransport(t, allFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock, Poll: time.Millisecond})
		t.Cleanup(func() { _ = tr.Close() })
		return tr, tr
	})
}

// The suite's real-time mode, on the system clock and the transport's
// polling, with a short tick.
func TestTransportRealTime(t *testing.T) {
	t.Parallel()
	f := allFeatures
	f.RealTime, f.Tick = true, 50*time.Millisecond
	idemtest.TestTransport(t, f, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock})
		t.Cleanup(func() { _ = tr.Close() })
		return tr, tr
	})
}
