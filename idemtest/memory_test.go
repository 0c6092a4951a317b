// This file runs every conformance suite of idemtest that idemmem, the
// in-memory reference implementation, qualifies for: the suites' own check
// that what they demand can be met. (idemmem lives in the root module, which
// requires nothing, so its conformance is tested here.)
//
// Passes: TestStore (Store), TestInbox (Inbox), TestOutbox (Outbox),
// TestDeadLetters (DeadLetters), TestLedger (Ledger), and TestTransport
// (Transport) on the suite's manual clock and again in real time.
//
// Does not implement: TestTxEffects (the Store is no idem.TxStore: its
// records share no transaction with an effect) and TestOutboxMover (the
// Transport has no MoveOutbox).

package idemtest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return idemmem.NewStore(&idemmem.Config{Clock: clock})
	})
}

func TestMemoryInbox(t *testing.T) {
	t.Parallel()
	idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
		return idemmem.NewInbox(), counterEffects{&idemmem.Counters{}}
	})
}

func TestMemoryOutbox(t *testing.T) {
	t.Parallel()
	idemtest.TestOutbox(t, func(t *testing.T, clock idem.Clock) idem.Outbox {
		return idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock})
	})
}

func TestMemoryDeadLetters(t *testing.T) {
	t.Parallel()
	idemtest.TestDeadLetters(t, func(t *testing.T, clock idem.Clock) idem.DeadLetters {
		return idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock})
	})
}

func TestMemoryLedger(t *testing.T) {
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

func TestMemoryTransport(t *testing.T) {
	t.Parallel()
	idemtest.TestTransport(t, allFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock, Poll: time.Millisecond})
		t.Cleanup(func() { _ = tr.Close() })
		return tr, tr
	})
}

// The suite's real-time mode, on the system clock and the transport's
// polling, with a short tick.
func TestMemoryTransportRealTime(t *testing.T) {
	t.Parallel()
	f := allFeatures
	f.RealTime, f.Tick = true, 50*time.Millisecond
	idemtest.TestTransport(t, f, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock})
		t.Cleanup(func() { _ = tr.Close() })
		return tr, tr
	})
}

// The suite's real-time mode on a machine under load, made certain, with
// the AckWait of idempg's database-clock run (400 ms): a Next returns its
// delivery 60 ms after the transport handed it out (the first slowNexts
// of each subtest, so that Many's thousand stay quick), and the first
// InProgress of each subtest reaches the transport 450 ms after it was
// called, past any AckWait it could renew. The suite counts an AckWait
// from before the Next that began it, and an InProgress's from before
// the call, and runs a scenario again when a call came past the AckWait:
// none of that is the transport's fault, and none fails the suite. The
// later calls are not slowed, so that a retry has the margin a real run
// has.
func TestMemoryTransportRealTimeOnASlowMachine(t *testing.T) {
	t.Parallel()
	f := allFeatures
	f.RealTime, f.Tick = true, 200*time.Millisecond
	idemtest.TestTransport(t, f, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock})
		t.Cleanup(func() { _ = tr.Close() })
		var late atomic.Bool
		var delivered atomic.Int32
		b := brokenTransport{Transport: tr, delivery: func(d idem.Delivery) idem.Delivery {
			if delivered.Add(1) <= slowNexts {
				time.Sleep(60 * time.Millisecond)
			}
			return lateInProgress{d, &late}
		}}
		return b, b
	})
}

// The slow machine of TestMemoryTransportRealTimeOnASlowMachine, for the
// cases of InProgressBatch (its streams there are not idem.BatchRenewer):
// the first slowNexts Nexts of each subtest return 60 ms after the
// transport handed their delivery out, and its first InProgressBatch
// reaches the transport 450 ms after it was called, past the AckWait of
// every delivery of the call. The suite counts from before the Nexts and
// the call and runs a scenario again when the call came past the AckWait.
func TestMemoryTransportRealTimeOnASlowMachineRenewsInBatches(t *testing.T) {
	t.Parallel()
	f := allFeatures
	f.RealTime, f.Tick = true, 200*time.Millisecond
	idemtest.TestTransport(t, f, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock})
		t.Cleanup(func() { _ = tr.Close() })
		var late atomic.Bool
		var delivered atomic.Int32
		b := brokenTransport{
			Transport: tr,
			afterNext: func() {
				if delivered.Add(1) <= slowNexts {
					time.Sleep(60 * time.Millisecond)
				}
			},
			renew: func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error) {
				if len(ds) > 0 && late.CompareAndSwap(false, true) {
					time.Sleep(450 * time.Millisecond)
				}
				return br.InProgressBatch(ctx, ds)
			},
		}
		return b, b
	})
}

// slowNexts is how many of a subtest's Nexts the slow machine's test
// slows: the first of AckWait, InProgress and ExpiredIsStale is enough.
const slowNexts = 4

// lateInProgress reaches the transport 450 ms after the first call of its
// subtest; the others at once.
type lateInProgress struct {
	idem.Delivery
	late *atomic.Bool
}

func (d lateInProgress) InProgress(ctx context.Context) error {
	if d.late.CompareAndSwap(false, true) {
		time.Sleep(450 * time.Millisecond)
	}
	return d.Delivery.InProgress(ctx)
}

func TestMemoryMiddleware(t *testing.T) {
	t.Parallel()
	idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return idemmem.NewStore(&idemmem.Config{Clock: clock})
	})
}

// The engine's behaviours through idemhttp, on the in-memory store.
func TestMemoryFaceHTTP(t *testing.T) {
	t.Parallel()
	idemtest.TestFace(t, idemtest.HTTP, func(t *testing.T, clock idem.Clock) idem.Store {
		return idemmem.NewStore(&idemmem.Config{Clock: clock})
	})
}
