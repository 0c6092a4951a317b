package idemredis_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

// A mark is where the documentation says, as 20 digits, with no expiry,
// and the lease is gone once the mark has committed.
func TestInboxSequenceKeys(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, &idemredis.InboxConfig{Retention: time.Second})
	ctx := t.Context()
	for _, tc := range []struct {
		consumer, aggregate string
		seq                 uint64
		mark, lease         string
		value               string
	}{
		{"c", "acct-1", 7, ":inbox-seq:{c}:acct-1", ":inbox-seq-lease:{c}:acct-1", "00000000000000000007"},
		{"a}b", "x:{y}", 18446744073709551615, ":inbox-seq:{a%7Db}:x:{y}", ":inbox-seq-lease:{a%7Db}:x:{y}", "18446744073709551615"},
	} {
		if err := in.ProcessSequence(ctx, tc.consumer, tc.aggregate, tc.seq, idem.GapAllow, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("ProcessSequence(%q, %q) = %v", tc.consumer, tc.aggregate, err)
		}
		key := effects.prefix + tc.mark
		if v, err := effects.client.Get(ctx, key).Result(); err != nil || v != tc.value {
			t.Errorf("GET %s = %q, %v; want %q", key, v, err, tc.value)
		}
		if ttl, err := effects.client.PTTL(ctx, key).Result(); err != nil || ttl != -1 {
			t.Errorf("PTTL %s = %v, %v; want no expiry: a mark must outlive Retention", key, ttl, err)
		}
		if n, err := effects.client.Exists(ctx, effects.prefix+tc.lease).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS %s after the commit = %d, %v; want 0", effects.prefix+tc.lease, n, err)
		}
	}
}

// A delivery whose lease ends while fn runs loses the aggregate to another
// delivery: that one commits, and the first one's commit is refused, with
// nothing of its effect applied.
func TestInboxSequenceLeaseEndsDuringFn(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, &idemredis.InboxConfig{Lease: 100 * time.Millisecond})
	ctx := t.Context()

	started, secondDone := make(chan struct{}), make(chan struct{})
	firstErr := make(chan error, 1)
	go func() {
		firstErr <- in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
			if err := effects.Write(ctx, "first"); err != nil {
				return err
			}
			close(started)
			select {
			case <-secondDone:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	<-started

	var calls atomic.Int32
	err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
		calls.Add(1)
		return effects.Write(ctx, "second")
	})
	close(secondDone)
	if err != nil {
		t.Fatalf("ProcessSequence after the first delivery's lease ended = %v, want nil", err)
	}
	if calls.Load() != 1 {
		t.Errorf("the taker-over's fn ran %d times, want 1", calls.Load())
	}
	if err := <-firstErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("the first delivery's ProcessSequence = %v, want an error matching idem.ErrLeaseLost", err)
	}
	wantCount(t, effects, "first", 0)
	wantCount(t, effects, "second", 1)
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("ProcessSequence after the taker-over committed = %v, want idem.ErrDuplicate", err)
	}
}

// A delivery whose lease ends while fn runs still commits when nobody took
// the aggregate over in the meantime.
func TestInboxSequenceLeaseEndsUnclaimed(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, &idemredis.InboxConfig{Lease: time.Minute})
	ctx := t.Context()
	lease := effects.prefix + ":inbox-seq-lease:{c}:acct-1"
	err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
		if n, err := effects.client.Exists(ctx, lease).Result(); err != nil || n != 1 {
			t.Errorf("EXISTS %s during fn = %d, %v; want 1", lease, n, err)
		}
		// The lease ends now, by hand: a lease short enough to end on its
		// own inside fn could end before the EXISTS above on a loaded
		// machine.
		if err := effects.client.PExpire(ctx, lease, time.Millisecond).Err(); err != nil {
			t.Errorf("PEXPIRE %s: %v", lease, err)
		}
		idemtest.Eventually(t, 5*time.Second, "the lease to end", func() bool {
			n, err := effects.client.Exists(ctx, lease).Result()
			return err == nil && n == 0
		})
		return effects.Write(ctx, "effect")
	})
	if err != nil {
		t.Fatalf("ProcessSequence = %v, want nil", err)
	}
	wantCount(t, effects, "effect", 1)
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("ProcessSequence again = %v, want idem.ErrDuplicate", err)
	}
}

// A mark key holding what the Inbox never writes is an error, and nothing
// runs.
func TestInboxSequenceForeignMark(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	for _, v := range []string{"7", "0000000000000000000x", "not a mark at all", "99999999999999999999"} {
		if err := effects.client.Set(ctx, effects.prefix+":inbox-seq:{c}:acct-1", v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		ran := false
		err := in.ProcessSequence(ctx, "c", "acct-1", 8, idem.GapAllow, func(context.Context) error { ran = true; return nil })
		if err == nil || errors.Is(err, idem.ErrDuplicate) || ran {
			t.Errorf("ProcessSequence on a mark key holding %q = %v (ran %v), want an error and no run", v, err, ran)
		}
	}
	if n, err := effects.client.Exists(ctx, effects.prefix+":inbox-seq-lease:{c}:acct-1").Result(); err != nil || n != 0 {
		t.Errorf("a lease was left behind: EXISTS = %d, %v", n, err)
	}
}

// A command Redis refuses as it is queued aborts the whole transaction:
// the mark stays, and the lease is released, so the redelivery runs.
func TestInboxSequenceQueuedCommandRefused(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
		if err := effects.Write(ctx, "refused"); err != nil {
			return err
		}
		pipe, _ := idemredis.InboxTx(ctx)
		pipe.Do(ctx, "NO-SUCH-COMMAND")
		return nil
	})
	if err == nil || errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("ProcessSequence queuing an unknown command = %v, want an error", err)
	}
	wantCount(t, effects, "refused", 0)
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error { return effects.Write(ctx, "refused") }); err != nil {
		t.Errorf("ProcessSequence after an aborted commit = %v, want nil: the lease must be released and the mark unchanged", err)
	}
	wantCount(t, effects, "refused", 1)
}

// A panicking fn releases the lease, so a redelivery runs.
func TestInboxSequencePanic(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the fn's panic", r)
			}
		}()
		_ = in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
			_ = effects.Write(ctx, "effect")
			panic("boom")
		})
	}()
	wantCount(t, effects, "effect", 0)
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error { return effects.Write(ctx, "effect") }); err != nil {
		t.Errorf("ProcessSequence after a panic = %v, want nil", err)
	}
	wantCount(t, effects, "effect", 1)
}

// A delivery waiting for the aggregate's lease gives up when its context
// ends; one of another aggregate does not wait.
func TestInboxSequenceWaitCancelled(t *testing.T) {
	t.Parallel()
	in, _ := newInbox(t, nil)
	ctx := t.Context()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	// The same number: a higher one would meet a gap at once, without
	// waiting (the mark is read before the lease).
	if err := in.ProcessSequence(wctx, "c", "acct-1", 1, idem.GapHold, func(context.Context) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ProcessSequence waiting past its deadline = %v, want context.DeadlineExceeded", err)
	}
	if err := in.ProcessSequence(ctx, "c", "acct-2", 1, idem.GapHold, func(context.Context) error { return nil }); err != nil {
		t.Errorf("ProcessSequence of another aggregate = %v, want nil", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("the holder's ProcessSequence = %v, want nil", err)
	}
}

// Marks and message marks under one prefix never meet: a dedup key spelt
// like an aggregate has its own key.
func TestInboxSequenceApartFromProcess(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	nop := func(context.Context) error { return nil }
	if err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, nop); err != nil {
		t.Fatal(err)
	}
	if err := in.Process(ctx, "c", "acct-1", nop); err != nil {
		t.Errorf("Process(c, acct-1) after ProcessSequence(c, acct-1) = %v, want nil", err)
	}
	keys, err := effects.client.Keys(ctx, effects.prefix+":*").Result()
	if err != nil || len(keys) != 2 {
		t.Errorf("keys %q, %v; want the mark and the message mark", keys, err)
	}
	if _, err := effects.client.Get(ctx, effects.prefix+":inbox:{c}:acct-1").Result(); errors.Is(err, redis.Nil) {
		t.Error("the message mark is missing")
	}
}
