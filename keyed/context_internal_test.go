package keyed

import (
	"context"
	"testing"
	"time"
)

// detached's context outlives the request's, carries its values (its
// Execution included), ends at its deadline, and makes no timer for a
// store that reads only the deadline.
func TestDetached(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	ex := newExecCtx(parent, time.Hour, Execution{Key: "k"})
	d, stop := detached(ex)
	defer stop()
	cancel()
	dl, ok := d.Deadline()
	if !ok || time.Until(dl) > 10*time.Second || time.Until(dl) < 9*time.Second {
		t.Errorf("deadline %v, %v; want 10s from now", dl, ok)
	}
	if e, ok := ExecutionFromContext(d); !ok || e.Key != "k" {
		t.Errorf("ExecutionFromContext = %+v, %v; want the request's", e, ok)
	}
	if d.(*execCtx).inner.Load() != nil {
		t.Error("the deadline and the Execution alone made a timer")
	}
	if d.Value(key{}) != "v" {
		t.Error("the request's values are lost")
	}
	if d.Err() != nil {
		t.Errorf("ended with the request: %v", d.Err())
	}
	stop()
	select {
	case <-d.Done():
	default:
		t.Error("stop did not end it")
	}
}
