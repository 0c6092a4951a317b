// This file runs every conformance suite of idemtest that idemredis
// qualifies for; the package's own tests are in the other files.
//
// Passes: TestStore (Store, on go-redis and on rueidis) and TestInbox
// (Inbox). TestStoreWithIfEq in ifeq_internal_test.go runs TestStore a
// third time, with completions by SET … IFEQ; it stays there because it
// reaches into the package's internals.
//
// Does not implement: TestTxEffects (Redis shares no transaction with the
// caller's database: a lease with a fencing token bounds the damage
// instead), TestOutbox, TestDeadLetters, TestLedger, TestTransport,
// TestOutboxMover and TestPerKeyOrder (no outbox, dead letters, ledger or
// transport).

package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, client, &idemredis.Config{Prefix: randomPrefix(t), Clock: clock})
	})
}

// The middleware on the store.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, client, &idemredis.Config{Prefix: randomPrefix(t), Clock: clock})
	})
}

// The engine's behaviours through idemhttp, in the separate form.
func TestFace(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	idemtest.TestFace(t, idemtest.HTTP, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, client, &idemredis.Config{Prefix: randomPrefix(t), Clock: clock})
	})
}

// The same suite with the store on rueidis, as Open makes it.
func TestStoreRueidis(t *testing.T) {
	t.Parallel()
	client := newRueidisClient(t)
	cleaner := newClient(t)
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		prefix := randomPrefix(t)
		s, err := idemredis.NewRueidisStore(t.Context(), client, &idemredis.Config{Prefix: prefix, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			deleteKeys(t, cleaner, prefix)
		})
		return s
	})
}

func TestInbox(t *testing.T) {
	t.Parallel()
	idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
		return newInbox(t, nil)
	})
}
