package idemredis_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

// redisEffects stands for a consumer's own Redis keys: each write is an
// INCR of "<prefix>:effect:<tag>", queued on the pipeliner of the inbox's
// transaction.
type redisEffects struct {
	client redis.UniversalClient
	prefix string
}

func (e *redisEffects) key(tag string) string { return e.prefix + ":effect:" + tag }

func (e *redisEffects) Write(ctx context.Context, tag string) error {
	pipe, ok := idemredis.InboxTx(ctx)
	if !ok {
		return errors.New("the context carries no inbox transaction")
	}
	return pipe.Incr(ctx, e.key(tag)).Err()
}

func (e *redisEffects) Count(ctx context.Context, tag string) (int, error) {
	v, err := e.client.Get(ctx, e.key(tag)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// newInbox returns an Inbox under a prefix of its own, and its effects;
// t.Cleanup deletes every key under the prefix. cfg may be nil.
func newInbox(t *testing.T, cfg *idemredis.InboxConfig) (*idemredis.Inbox, *redisEffects) {
	t.Helper()
	client := newClient(t)
	var c idemredis.InboxConfig
	if cfg != nil {
		c = *cfg
	}
	c.Prefix = randomPrefix(t)
	in, err := idemredis.NewInbox(t.Context(), client, &c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteKeys(t, client, c.Prefix) })
	return in, &redisEffects{client: client, prefix: c.Prefix}
}

// A delivery whose lease ends while fn runs loses the key to a redelivery:
// that one commits, and the first one's commit is refused, with nothing of
// its effect applied.
func TestInboxLeaseEndsDuringFn(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, &idemredis.InboxConfig{Lease: 100 * time.Millisecond})
	ctx := t.Context()

	started, secondDone := make(chan struct{}), make(chan struct{})
	firstErr := make(chan error, 1)
	go func() {
		firstErr <- in.Process(ctx, "c", "m-1", func(ctx context.Context) error {
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
	err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error {
		calls.Add(1)
		return effects.Write(ctx, "second")
	})
	close(secondDone)
	if err != nil {
		t.Fatalf("Process after the first delivery's lease ended = %v, want nil", err)
	}
	if calls.Load() != 1 {
		t.Errorf("the taker-over's fn ran %d times, want 1", calls.Load())
	}
	if err := <-firstErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("the first delivery's Process = %v, want an error matching idem.ErrLeaseLost", err)
	}
	wantCount(t, effects, "first", 0)
	wantCount(t, effects, "second", 1)
	if err := in.Process(ctx, "c", "m-1", func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process after the taker-over committed = %v, want idem.ErrDuplicate", err)
	}
}

// A delivery whose lease ends while fn runs still commits when nobody took
// the key over in the meantime: no commit of the message exists.
func TestInboxLeaseEndsUnclaimed(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, &idemredis.InboxConfig{Lease: time.Minute})
	ctx := t.Context()
	key := effects.prefix + ":inbox:{c}:m-1"
	err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error {
		if n, err := effects.client.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Errorf("EXISTS %s during fn = %d, %v; want 1", key, n, err)
		}
		// The lease ends now, by hand: a lease short enough to end on its
		// own inside fn could end before the EXISTS above on a loaded
		// machine.
		if err := effects.client.PExpire(ctx, key, time.Millisecond).Err(); err != nil {
			t.Errorf("PEXPIRE %s: %v", key, err)
		}
		idemtest.Eventually(t, 5*time.Second, "the lease to end", func() bool {
			n, err := effects.client.Exists(ctx, key).Result()
			return err == nil && n == 0
		})
		return effects.Write(ctx, "effect")
	})
	if err != nil {
		t.Fatalf("Process = %v, want nil", err)
	}
	wantCount(t, effects, "effect", 1)
	if err := in.Process(ctx, "c", "m-1", func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process again = %v, want idem.ErrDuplicate", err)
	}
}

// The mark of a processed message lasts Retention; after that the message
// runs again.
func TestInboxRetention(t *testing.T) {
	t.Parallel()
	const retention = 200 * time.Millisecond
	in, effects := newInbox(t, &idemredis.InboxConfig{Retention: retention})
	ctx := t.Context()
	fn := func(ctx context.Context) error { return effects.Write(ctx, "effect") }
	if err := in.Process(ctx, "c", "m-1", fn); err != nil {
		t.Fatalf("Process = %v, want nil", err)
	}
	key := effects.prefix + ":inbox:{c}:m-1"
	if ttl, err := effects.client.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > retention {
		t.Errorf("PTTL %s = %v, %v; want in (0, %v]", key, ttl, err, retention)
	}
	if err := in.Process(ctx, "c", "m-1", fn); !errors.Is(err, idem.ErrDuplicate) {
		t.Fatalf("Process within Retention = %v, want idem.ErrDuplicate", err)
	}
	idemtest.Eventually(t, 5*time.Second, "the mark to expire", func() bool {
		n, err := effects.client.Exists(ctx, key).Result()
		return err == nil && n == 0
	})
	if err := in.Process(ctx, "c", "m-1", fn); err != nil {
		t.Fatalf("Process after Retention = %v, want nil", err)
	}
	wantCount(t, effects, "effect", 2)
}

// Keys are where the Inbox documentation says, with the escaped consumer as
// the hash tag.
func TestInboxKeys(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	for _, tc := range []struct{ consumer, key, want string }{
		{"c", "m-1", ":inbox:{c}:m-1"},
		{"a}b", "k", ":inbox:{a%7Db}:k"},
		{"{%}", "x:{y}", ":inbox:{%7B%25%7D}:x:{y}"},
	} {
		if got := idemredis.InboxHashTag(tc.consumer); "{"+got[1:len(got)-1]+"}" != got {
			t.Errorf("InboxHashTag(%q) = %q, want it in braces", tc.consumer, got)
		}
		if err := in.Process(ctx, tc.consumer, tc.key, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("Process(%q, %q) = %v", tc.consumer, tc.key, err)
		}
		key := effects.prefix + tc.want
		if v, err := effects.client.Get(ctx, key).Result(); err != nil || v != "done" {
			t.Errorf("Process(%q, %q): GET %s = %q, %v; want \"done\"", tc.consumer, tc.key, key, v, err)
		}
	}
}

func TestInboxInvalidArguments(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	var calls atomic.Int32
	fn := func(context.Context) error { calls.Add(1); return nil }
	for _, tc := range []struct {
		name, consumer, key string
		fn                  func(context.Context) error
	}{
		{"empty consumer", "", "m-1", fn},
		{"empty key", "c", "", fn},
		{"nil fn", "c", "m-1", nil},
	} {
		var ae *idem.ArgumentError
		if err := in.Process(ctx, tc.consumer, tc.key, tc.fn); !errors.As(err, &ae) {
			t.Errorf("%s: Process = %v, want an *idem.ArgumentError", tc.name, err)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("fn ran %d times on invalid arguments, want 0", calls.Load())
	}
	if keys, err := effects.client.Keys(ctx, effects.prefix+":*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("keys after invalid calls = %q, %v; want none", keys, err)
	}

	client := newClient(t)
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		cfg    idemredis.InboxConfig
	}{
		{"nil client", nil, idemredis.InboxConfig{}},
		{"brace in prefix", client, idemredis.InboxConfig{Prefix: "a{b"}},
		{"negative lease", client, idemredis.InboxConfig{Lease: -time.Second}},
		{"sub-millisecond lease", client, idemredis.InboxConfig{Lease: time.Microsecond}},
		{"negative retention", client, idemredis.InboxConfig{Retention: -time.Second}},
		{"negative poll interval", client, idemredis.InboxConfig{PollInterval: -time.Second}},
	} {
		var ae *idem.ArgumentError
		if _, err := idemredis.NewInbox(ctx, tc.client, &tc.cfg); !errors.As(err, &ae) {
			t.Errorf("NewInbox with %s = %v, want an *idem.ArgumentError", tc.name, err)
		}
	}
}

// A command Redis refuses as it is queued aborts the whole transaction and
// releases the key; one that fails as it runs does not roll back the
// others or the mark, and Process says so.
func TestInboxQueuedCommandFails(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()

	err := in.Process(ctx, "c", "refused", func(ctx context.Context) error {
		if err := effects.Write(ctx, "refused"); err != nil {
			return err
		}
		pipe, _ := idemredis.InboxTx(ctx)
		pipe.Do(ctx, "NO-SUCH-COMMAND")
		return nil
	})
	if err == nil || errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process queuing an unknown command = %v, want an error", err)
	}
	wantCount(t, effects, "refused", 0)
	if err := in.Process(ctx, "c", "refused", func(ctx context.Context) error { return effects.Write(ctx, "refused") }); err != nil {
		t.Errorf("Process after an aborted commit = %v, want nil: the key must be released", err)
	}
	wantCount(t, effects, "refused", 1)

	hash := effects.prefix + ":a-hash"
	if err := effects.client.HSet(ctx, hash, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	err = in.Process(ctx, "c", "wrongtype", func(ctx context.Context) error {
		pipe, _ := idemredis.InboxTx(ctx)
		pipe.Incr(ctx, hash)
		return effects.Write(ctx, "wrongtype")
	})
	if !containsWrongType(err) {
		t.Errorf("Process with a command failing in EXEC = %v, want the WRONGTYPE error", err)
	}
	wantCount(t, effects, "wrongtype", 1)
	if err := in.Process(ctx, "c", "wrongtype", func(context.Context) error { return nil }); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process after a commit whose command failed = %v, want idem.ErrDuplicate", err)
	}
}

// containsWrongType reports whether err wraps a Redis WRONGTYPE error.
func containsWrongType(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if redis.HasErrorPrefix(e, "WRONGTYPE") {
			return true
		}
	}
	return false
}

// fn's pipeliner refuses to send its commands itself, and a context that
// does not come from Process carries none.
func TestInboxTx(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	if _, ok := idemredis.InboxTx(ctx); ok {
		t.Error("InboxTx of a plain context = true, want false")
	}
	err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error {
		pipe, ok := idemredis.InboxTx(ctx)
		if !ok {
			return errors.New("no pipeliner in fn's context")
		}
		pipe.Incr(ctx, effects.key("effect"))
		if _, err := pipe.Exec(ctx); err == nil {
			t.Error("Exec of fn's pipeliner = nil, want an error")
		}
		if _, err := pipe.Pipeline().Exec(ctx); err == nil {
			t.Error("Pipeline().Exec of fn's pipeliner = nil, want an error")
		}
		if _, err := pipe.TxPipelined(ctx, func(redis.Pipeliner) error { return nil }); err == nil {
			t.Error("TxPipelined of fn's pipeliner = nil, want an error")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Process = %v", err)
	}
	wantCount(t, effects, "effect", 1)
}

// A panicking fn releases the key, so a redelivery runs.
func TestInboxPanic(t *testing.T) {
	t.Parallel()
	in, effects := newInbox(t, nil)
	ctx := t.Context()
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the fn's panic", r)
			}
		}()
		_ = in.Process(ctx, "c", "m-1", func(ctx context.Context) error {
			_ = effects.Write(ctx, "effect")
			panic("boom")
		})
	}()
	wantCount(t, effects, "effect", 0)
	if err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error { return effects.Write(ctx, "effect") }); err != nil {
		t.Errorf("Process after a panic = %v, want nil", err)
	}
	wantCount(t, effects, "effect", 1)
}

// A delivery waiting for another to finish gives up when its context ends.
func TestInboxWaitCancelled(t *testing.T) {
	t.Parallel()
	in, _ := newInbox(t, nil)
	ctx := t.Context()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- in.Process(ctx, "c", "m-1", func(context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := in.Process(wctx, "c", "m-1", func(context.Context) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Process waiting past its deadline = %v, want context.DeadlineExceeded", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("the holder's Process = %v, want nil", err)
	}
}

func wantCount(t *testing.T, e *redisEffects, tag string, want int) {
	t.Helper()
	n, err := e.Count(t.Context(), tag)
	if err != nil {
		t.Fatalf("Count(%q): %v", tag, err)
	}
	if n != want {
		t.Errorf("%d committed writes tagged %q, want %d", n, tag, want)
	}
}
