package idemtest

import (
	"testing"
	"time"

	"github.com/idem-go/idem/internal/eventually"
)

// Eventually polls cond until it holds, failing the test if it does not
// within limit. It is for conditions nobody can signal: state in another
// process, a store, or a goroutine the test does not own. Where a channel
// can say when something happened, wait on the channel instead.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, limit, what, cond)
}
