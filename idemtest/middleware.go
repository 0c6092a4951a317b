package idemtest

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/internal/httpsuite"
)

// TestMiddleware checks idemhttp's middleware in front of the stores open
// makes, as requests and their duplicates meet it: replays of the first
// answer, concurrent duplicates running once, mismatches and scopes,
// classified failures (a 5xx or a panic keeps nothing), TTL expiry, lease
// takeover with the late execution fenced off, large answers, keys and
// bodies sealed at rest, and the phases an Observer sees. A store that is an
// idem.TxStore is checked in the same-transaction form, whose answers to a
// lost lease, an answer too large to keep and an aborted handler differ
// (the transaction rolls back).
//
// open must return a fresh, empty store that reads time from clock, as
// TestStore's constructor does. The cases run as parallel subtests.
func TestMiddleware(t *testing.T, open func(t *testing.T, clock idem.Clock) idem.Store) {
	t.Helper()
	httpsuite.Run(t, open)
}
