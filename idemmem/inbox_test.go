package idemmem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func TestInboxPanicReleases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	in := idemmem.NewInbox()
	var c idemmem.Counters
	func() {
		defer func() { _ = recover() }()
		_ = in.Process(ctx, "c", "k", func(ctx context.Context) error {
			_ = c.Add(ctx, "n", 1)
			panic("handler bug")
		})
	}()
	if c.Get("n") != 0 || in.Processed("c", "k") {
		t.Fatalf("a panicking fn left counter %d, processed %v; want 0, false", c.Get("n"), in.Processed("c", "k"))
	}
	// The key's lock was released: the redelivery runs.
	if err := in.Process(ctx, "c", "k", func(ctx context.Context) error { return c.Add(ctx, "n", 1) }); err != nil {
		t.Fatalf("Process after a panic: %v", err)
	}
	if c.Get("n") != 1 || !in.Processed("c", "k") {
		t.Errorf("counter %d, processed %v; want 1, true", c.Get("n"), in.Processed("c", "k"))
	}
}

func TestInboxWaitHonoursContext(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	in := idemmem.NewInbox()
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- in.Process(ctx, "c", "k", func(context.Context) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := in.Process(short, "c", "k", func(context.Context) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Process waiting for a held key = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("first Process: %v", err)
	}
	if err := in.Process(ctx, "c", "k", func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process after the first committed = %v, want ErrDuplicate", err)
	}
}

func TestInboxInvalid(t *testing.T) {
	t.Parallel()
	in := idemmem.NewInbox()
	fn := func(context.Context) error { return nil }
	for name, err := range map[string]error{
		"no consumer":  in.Process(t.Context(), "", "k", fn),
		"no dedup key": in.Process(t.Context(), "c", "", fn),
		"nil fn":       in.Process(t.Context(), "c", "k", nil),
	} {
		if !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Process with %s = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestTransact(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	boom := errors.New("boom")
	var c idemmem.Counters
	if err := idemmem.Transact(ctx, func(ctx context.Context) error {
		if err := c.Add(ctx, "n", 5); err != nil {
			return err
		}
		if got := c.Get("n"); got != 0 {
			t.Errorf("a write is visible before its Tx commits: %d", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := c.Get("n"); got != 5 {
		t.Errorf("after commit: %d, want 5", got)
	}

	err := idemmem.Transact(ctx, func(ctx context.Context) error {
		_ = c.Add(ctx, "n", 100)
		return boom
	})
	if err != boom {
		t.Errorf("Transact = %v, want fn's error unchanged", err)
	}
	if got := c.Get("n"); got != 5 {
		t.Errorf("after rollback: %d, want 5", got)
	}

	// Nested: a failing inner Transact drops only its own writes; a
	// succeeding one joins the outer, which decides.
	_ = idemmem.Transact(ctx, func(ctx context.Context) error {
		_ = c.Add(ctx, "n", 1)
		_ = idemmem.Transact(ctx, func(ctx context.Context) error {
			_ = c.Add(ctx, "n", 10)
			return boom
		})
		_ = idemmem.Transact(ctx, func(ctx context.Context) error {
			return c.Add(ctx, "n", 20)
		})
		if got := c.Get("n"); got != 5 {
			t.Errorf("an inner commit applied before the outer: %d", got)
		}
		return nil
	})
	if got := c.Get("n"); got != 26 {
		t.Errorf("after nested transactions: %d, want 26", got)
	}

	var leaked *idemmem.Tx
	_ = idemmem.Transact(ctx, func(ctx context.Context) error {
		leaked, _ = idemmem.TxFromContext(ctx)
		return nil
	})
	if err := leaked.OnCommit(func() {}); !errors.Is(err, idemmem.ErrTxDone) {
		t.Errorf("OnCommit after the Tx ended = %v, want ErrTxDone", err)
	}
	if _, ok := idemmem.TxFromContext(ctx); ok {
		t.Error("TxFromContext found a Tx in a plain context")
	}
}

func TestInboxSequencePanicReleases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	in := idemmem.NewInbox()
	var c idemmem.Counters
	func() {
		defer func() { _ = recover() }()
		_ = in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
			_ = c.Add(ctx, "n", 1)
			panic("handler bug")
		})
	}()
	if c.Get("n") != 0 || in.Mark("c", "acct-1") != 0 {
		t.Fatalf("a panicking fn left counter %d, mark %d; want 0, 0", c.Get("n"), in.Mark("c", "acct-1"))
	}
	// The aggregate's lock was released: the redelivery runs.
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error { return c.Add(ctx, "n", 1) }); err != nil {
		t.Fatalf("ProcessSequence after a panic: %v", err)
	}
	if c.Get("n") != 1 || in.Mark("c", "acct-1") != 1 {
		t.Errorf("counter %d, mark %d; want 1, 1", c.Get("n"), in.Mark("c", "acct-1"))
	}
}

// A call waiting for another of the same aggregate gives up when its
// context ends, and then reads the mark the other left.
func TestInboxSequenceWaitHonoursContext(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	in := idemmem.NewInbox()
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := in.ProcessSequence(short, "c", "acct-1", 2, idem.GapHold, func(context.Context) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ProcessSequence waiting for a held aggregate = %v, want DeadlineExceeded", err)
	}
	// Another aggregate does not wait.
	if err := in.ProcessSequence(ctx, "c", "acct-2", 1, idem.GapHold, func(context.Context) error { return nil }); err != nil {
		t.Errorf("ProcessSequence of another aggregate while acct-1 is held = %v, want nil", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("first ProcessSequence: %v", err)
	}
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("ProcessSequence after the first committed = %v, want ErrDuplicate", err)
	}
}

func TestInboxMark(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	in := idemmem.NewInbox()
	nop := func(context.Context) error { return nil }
	if m := in.Mark("c", "acct-1"); m != 0 {
		t.Errorf("Mark of an aggregate never processed = %d, want 0", m)
	}
	if err := in.ProcessSequence(ctx, "c", "acct-1", 7, idem.GapAllow, nop); err != nil {
		t.Fatal(err)
	}
	if err := in.ProcessSequence(ctx, "c", "acct-1", 9, idem.GapHold, nop); !errors.Is(err, idem.ErrSequenceGap) {
		t.Fatalf("ProcessSequence(9) on mark 7 = %v, want a gap", err)
	}
	if m := in.Mark("c", "acct-1"); m != 7 {
		t.Errorf("Mark = %d, want 7", m)
	}
	if m := in.Mark("other", "acct-1"); m != 0 {
		t.Errorf("Mark of another consumer = %d, want 0", m)
	}
	if in.Processed("c", "acct-1") {
		t.Error("a mark counts as a processed dedup key")
	}
}
