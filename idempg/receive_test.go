package idempg_test

import (
	"context"
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

// await returns nil once ch is closed, or ctx's error if ctx ends first. A
// test's goroutine that holds a transaction (or waits to begin one) waits
// for the test's go-ahead with it, on a context that ends when the test
// does (t.Context ends just before the cleanups run): a test that fails
// before it gives the go-ahead then ends the transaction, and the DB's
// Close among the cleanups does not wait for its connection for ever.
func await(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
