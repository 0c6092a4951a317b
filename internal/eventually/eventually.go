// Package eventually waits, in tests, for a condition nobody can signal.
//
// It is the root module's own, because that module requires nothing outside
// the standard library, not even for its tests; idemtest.Eventually offers
// the same to every other module and to users.
package eventually

import (
	"testing"
	"time"
)

// True polls cond until it holds, failing the test if it does not within
// limit. It is for conditions nobody can signal: state in another process,
// a store, or a goroutine the test does not own. Where a channel can say
// when something happened, wait on the channel instead.
func True(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for step := time.Millisecond; !cond(); step = min(2*step, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(step)
	}
}

// Progressing polls count until it reaches want, failing the test only when
// count has not grown for stall: for a load whose length depends on the
// machine (thousands of messages on two busy cores), where a bound on the
// whole wait fails a slow run that was getting there, and a bound on each
// step still fails one that is stuck.
func Progressing(t testing.TB, stall time.Duration, what string, want int64, count func() int64) {
	t.Helper()
	last, moved := count(), time.Now()
	for step := time.Millisecond; last < want; step = min(2*step, 20*time.Millisecond) {
		time.Sleep(step)
		n := count()
		if n > last {
			last, moved = n, time.Now()
			continue
		}
		if time.Since(moved) > stall {
			t.Fatalf("no progress for %s waiting for %s: %d of %d", stall, what, last, want)
		}
	}
}
