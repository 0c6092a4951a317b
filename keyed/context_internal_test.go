package keyed

import (
	"context"
	"errors"
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

// Reading a value the request's context carries (grpc-go does, on the way
// to the handler) makes no timer; cancellation, Cause and AfterFunc are
// as WithDeadline's on WithoutCancel(parent), the parent's own
// cancellation (the caller leaving, with its cause) hidden.
func TestValuesMakeNoTimer(t *testing.T) {
	type key struct{}
	type absent struct{}
	gone := errors.New("caller left")
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	c := newExecCtx(parent, time.Hour, Execution{Key: "k"})
	if c.Value(key{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	if c.inner.Load() != nil {
		t.Fatal("reading the parent's value made a timer")
	}
	cancel(gone)
	if err, cause := c.Err(), context.Cause(c); err != nil || cause != nil {
		t.Fatalf("after the caller left: Err %v, Cause %v; want nil, nil", err, cause)
	}
	if c.Value(absent{}) != nil {
		t.Fatal("a value nobody set was found")
	}

	lost := errors.New("lease lost")
	child, stopChild := context.WithCancel(context.WithValue(c, absent{}, 1))
	defer stopChild()
	ran := make(chan struct{})
	context.AfterFunc(c, func() { close(ran) })
	c.fail(lost)
	<-child.Done()
	<-ran
	if !errors.Is(c.Err(), context.Canceled) || context.Cause(c) != lost || context.Cause(child) != lost {
		t.Fatalf("after fail: Err %v, Cause %v, child's Cause %v; want Canceled, %v, %v", c.Err(), context.Cause(c), context.Cause(child), lost, lost)
	}
}

// A context that fails before anything made its timer still reports its
// cause, to the first question asked, a value lookup included.
func TestCauseOfAnUnwatchedContext(t *testing.T) {
	type key struct{}
	lost := errors.New("lease lost")
	c := newExecCtx(context.WithValue(context.Background(), key{}, "v"), time.Hour, Execution{})
	if c.Value(key{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	c.fail(lost)
	if got := context.Cause(c); got != lost {
		t.Fatalf("Cause %v, want %v", got, lost)
	}
	c.stop()
	if got := context.Cause(c); got != lost {
		t.Fatalf("after stop: Cause %v, want %v", got, lost)
	}
}

// A context stopped or failed before its deadline, its deadline's context
// made only after the deadline passed, ends as WithDeadline's would have:
// Canceled, or with fail's cause; one stopped after its deadline ends by
// the deadline.
func TestEndedBeforeItsDeadline(t *testing.T) {
	lost := errors.New("lease lost")
	stopped := newExecCtx(context.Background(), time.Hour, Execution{})
	stopped.stop()
	failed := newExecCtx(context.Background(), time.Hour, Execution{})
	failed.fail(lost)
	for _, c := range []*execCtx{stopped, failed} {
		c.deadline = time.Now().Add(-time.Millisecond) // the deadline passes before anything asks
	}
	if err := stopped.Err(); err != context.Canceled {
		t.Errorf("stopped before its deadline: Err %v, want %v", err, context.Canceled)
	}
	if err, cause := failed.Err(), context.Cause(failed); err != context.Canceled || cause != lost {
		t.Errorf("failed before its deadline: Err %v, Cause %v; want %v, %v", err, cause, context.Canceled, lost)
	}
	late := newExecCtx(context.Background(), -time.Millisecond, Execution{})
	late.stop()
	if err := late.Err(); err != context.DeadlineExceeded {
		t.Errorf("stopped after its deadline: Err %v, want %v", err, context.DeadlineExceeded)
	}
}
