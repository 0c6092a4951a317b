package keyed_test

import (
	"testing"
	"time"
)

// waitBound is how long a test waits for a signal before it fails: far
// longer than any of them takes, so that a defect that keeps one from
// coming fails its test with a message rather than hanging the package
// until go test's timeout.
const waitBound = 30 * time.Second

// receive returns what ch gives, and ends the test, naming what did not
// happen, when ch gives nothing within waitBound.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitBound)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s within %v", what, waitBound)
		panic("unreachable")
	}
}
