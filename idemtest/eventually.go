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

// EventuallyProgressing polls count until it reaches want, failing the
// test only when count has not grown for stall. It is for a load whose
// length depends on the machine: a bound on the whole wait fails a slow
// run that was getting there; a bound on each step still fails one that
// is stuck.
func EventuallyProgressing(t testing.TB, stall time.Duration, what string, want int64, count func() int64) {
	t.Helper()
	eventually.Progressing(t, stall, what, want, count)
}
