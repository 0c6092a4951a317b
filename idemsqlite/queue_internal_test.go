package idemsqlite

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// queued waits until n callers wait in q.
func queued(t *testing.T, q *writerQueue, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q.mu.Lock()
		got := len(q.waiting)
		q.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers waiting, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// Turns go in the order they were asked for, and a caller whose context
// ends while it waits leaves the line without taking a turn.
func TestWriterQueueOrder(t *testing.T) {
	var q writerQueue
	ctx := t.Context()
	if err := q.acquire(ctx, true); err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 4)
	gone, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	for i := range 4 {
		if i == 2 {
			go func() { left <- q.acquire(gone, true) }()
		} else {
			go func() {
				if err := q.acquire(ctx, true); err != nil {
					t.Error(err)
				}
				order <- i
				q.release()
			}()
		}
		queued(t, &q, i+1)
	}
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire with its context ended = %v, want context.Canceled", err)
	}
	queued(t, &q, 3)
	q.release()
	for _, want := range []int{0, 1, 3} {
		if got := <-order; got != want {
			t.Fatalf("turn went to %d, want %d", got, want)
		}
	}
	// Free again: the next caller takes it at once.
	if err := q.acquire(ctx, true); err != nil {
		t.Fatal(err)
	}
	q.release()
}

// A turn handed to a caller whose context has just ended goes to the next
// one rather than being lost.
func TestWriterQueueHandOffToEndedCaller(t *testing.T) {
	var q writerQueue
	ctx := t.Context()
	if err := q.acquire(ctx, true); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.acquire(ended, true) }()
	queued(t, &q, 1)
	// The turn is handed over and the context ended together: whichever
	// the waiter sees first, the turn must not be lost.
	q.release()
	cancel()
	err := <-done
	if err == nil {
		q.release() // it took the turn: give it back
	}
	got := make(chan struct{})
	go func() {
		if err := q.acquire(ctx, true); err != nil {
			t.Error(err)
		}
		close(got)
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was lost")
	}
	q.release()
}
