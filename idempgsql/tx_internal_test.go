package idempgsql

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The savepoints of one transaction: a call made beside a short call of
// idem's waits for it, one made beside a handler is refused, a call's end
// waits for the calls its code left running, and a context of a call that
// ended opens nothing. Each wait is checked by what holds when it returns,
// not by time.
func TestSavepointStack(t *testing.T) {
	blocked := make(chan struct{}, 1)
	testHookBlocked = func() { blocked <- struct{}{} }
	defer func() { testHookBlocked = func() {} }()
	waitBlocked := func(what string) {
		t.Helper()
		select {
		case <-blocked:
		case <-time.After(10 * time.Second): // a bound on failure, not a timing
			t.Fatalf("%s did not wait", what)
		}
	}
	ctx := t.Context()
	st := &txState{}
	root := &txRef{st: st}

	short, err := root.wait(ctx, "short", false, true)
	if err != nil || st.top != short {
		t.Fatalf("the first call: %v, top %v", err, st.top)
	}
	sibling := make(chan *savepoint, 1)
	go func() {
		sp, err := root.wait(ctx, "sibling", false, true)
		if err != nil {
			t.Error(err)
		}
		sibling <- sp
	}()
	waitBlocked("a call beside a short call")
	st.close(short)
	sp := <-sibling
	if sp.parent != nil {
		t.Fatalf("the sibling's savepoint is inside %s's", sp.parent.call)
	}
	st.close(sp)

	handler, err := root.wait(ctx, "handler", true, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.wait(ctx, "beside", false, true); !errors.Is(err, ErrTxBusy) {
		t.Errorf("a call beside a running handler = %v, want ErrTxBusy", err)
	}
	if _, err := root.wait(ctx, "beside", false, false); !errors.Is(err, ErrTxBusy) {
		t.Errorf("joining beside a running handler = %v, want ErrTxBusy", err)
	}
	inside := &txRef{st: st, at: handler}
	child, err := inside.wait(ctx, "child", false, true)
	if err != nil || child.parent != handler {
		t.Fatalf("a call inside the handler: %v, parent %v", err, child.parent)
	}
	settled := make(chan bool)
	go func() {
		st.settle(handler)
		st.mu.Lock()
		defer st.mu.Unlock()
		settled <- child.closed
	}()
	waitBlocked("the handler's end")
	st.close(child)
	if !<-settled {
		t.Fatal("the handler's end did not wait for the call it left running")
	}
	if _, err := inside.wait(ctx, "late", false, true); !errors.Is(err, errCallReturned) {
		t.Errorf("a call with the handler's context as it ends = %v, want errCallReturned", err)
	}
	st.close(handler)
	if st.top != nil {
		t.Fatalf("top %v after every call closed", st.top)
	}
	if _, err := inside.wait(ctx, "late", false, true); !errors.Is(err, errCallReturned) {
		t.Errorf("a call with the context of a handler that returned = %v, want errCallReturned", err)
	}

	// A wait ends with its context.
	blocker, _ := root.wait(ctx, "blocker", false, true)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := root.wait(cctx, "cancelled", false, true); !errors.Is(err, context.Canceled) {
		t.Errorf("a wait whose context ended = %v", err)
	}
	st.close(blocker)
}
