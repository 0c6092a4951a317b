package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// testClient returns a go-redis client of the test Redis, closed by
// t.Cleanup (the external tests have their own helpers).
func testClient(t *testing.T) *redis.Client {
	t.Helper()
	url := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() { client.Close() })
	return client
}

// testStore makes a Store on c; t.Cleanup closes it and deletes its keys.
func testStore(t *testing.T, client *redis.Client, c conn, clock idem.Clock) *Store {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	prefix := "idemtest-" + hex.EncodeToString(b)
	s, err := newStore(t.Context(), c, &Config{Prefix: prefix, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, err := client.Keys(ctx, prefix+":*").Result()
		if err == nil && len(keys) > 0 {
			err = client.Unlink(ctx, keys...).Err()
		}
		if err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	})
	return s
}

// serverHasIfEq reports whether the test server takes SET … IFEQ, from its
// version: Redis 8.4, Valkey 8.1.
func serverHasIfEq(t *testing.T, client *redis.Client) bool {
	t.Helper()
	info, err := client.Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
				return v
			}
		}
		return ""
	}
	atLeast := func(version string, major, minor int) bool {
		parts := strings.SplitN(version, ".", 3)
		if len(parts) < 2 {
			return false
		}
		ma, err1 := strconv.Atoi(parts[0])
		mi, err2 := strconv.Atoi(parts[1])
		return err1 == nil && err2 == nil && (ma > major || ma == major && mi >= minor)
	}
	if v := field("valkey_version"); v != "" {
		return atLeast(v, 8, 1)
	}
	return atLeast(field("redis_version"), 8, 4)
}

// New finds out whether the server takes SET … IFEQ; on one that does not
// (this machine's Redis 7.0), every completion is the script, and works.
func TestIfEqDetection(t *testing.T) {
	t.Parallel()
	client := testClient(t)
	s := testStore(t, client, goredisConn{client}, nil)
	want := serverHasIfEq(t, client)
	if got := s.ifeq.Load(); got != want {
		t.Fatalf("IFEQ detected = %v, want %v for this server", got, want)
	}
	c, err := s.Claim(t.Context(), idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", c.Outcome, err)
	}
	if err := s.Complete(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: c.Token}, idem.Response{Status: 201}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if r, err := s.Get(t.Context(), "s", "k"); err != nil || r.State != idem.StateCompleted || r.Response.Status != 201 {
		t.Errorf("Get = %+v, %v; want completed with 201", r, err)
	}
}

// A store that believes the server takes IFEQ, on one that does not,
// completes through the script when the server refuses the syntax, and
// stops trying.
func TestIfEqFallbackAtRunTime(t *testing.T) {
	t.Parallel()
	client := testClient(t)
	if serverHasIfEq(t, client) {
		t.Skip("the test server takes SET … IFEQ")
	}
	s := testStore(t, client, goredisConn{client}, nil)
	s.ifeq.Store(true)
	for i, key := range []idem.Key{"a", "b"} {
		c, err := s.Claim(t.Context(), idem.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("Claim(%s) = %v, %v", key, c.Outcome, err)
		}
		if err := s.Complete(t.Context(), idem.Ref{Scope: "s", Key: key, Token: c.Token}, idem.Response{Status: 201}); err != nil {
			t.Fatalf("Complete(%s): %v", key, err)
		}
		if r, err := s.Get(t.Context(), "s", key); err != nil || r.State != idem.StateCompleted {
			t.Errorf("Get(%s) = %+v, %v; want completed", key, r, err)
		}
		if i == 0 && s.ifeq.Load() {
			t.Error("the store kept trying IFEQ after the server refused it")
		}
	}
}

// ifeqConn is a conn on go-redis whose SET … IFEQ is a script doing the
// same, so that the store's native completion runs on a Redis without it.
type ifeqConn struct {
	goredisConn
	attempts, sets atomic.Int64
}

var emulatedIfEq = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return false
end
redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
return 'OK'
`)

func (c *ifeqConn) probeIfEq(context.Context, string) error { return nil }

func (c *ifeqConn) setIfEq(ctx context.Context, key, value, old string) (bool, error) {
	c.attempts.Add(1)
	err := emulatedIfEq.Run(ctx, c.c, []string{key}, value, old).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err == nil {
		c.sets.Add(1)
	}
	return err == nil, err
}

// The conformance suite, with every completion this process can make
// natively made by (emulated) SET … IFEQ.
func TestStoreWithIfEq(t *testing.T) {
	t.Parallel()
	client := testClient(t)
	c := &ifeqConn{goredisConn: goredisConn{client}}
	// The subtests run in parallel, after this function returns.
	t.Cleanup(func() {
		if c.sets.Load() == 0 {
			t.Error("no completion went through IFEQ")
		}
	})
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		s := testStore(t, client, c, clock)
		if !s.ifeq.Load() {
			t.Fatal("the store does not use IFEQ")
		}
		return s
	})
}

// IFEQ writes exactly the completed record the complete script writes; a
// record flagged by a waiter, or taken over, makes it fall back to the
// script, which publishes the change or refuses the stale holder.
func TestIfEqCompletion(t *testing.T) {
	t.Parallel()
	client := testClient(t)
	clock := idemmem.NewClock(idemtest.Start)
	c := &ifeqConn{goredisConn: goredisConn{client}}
	native := testStore(t, client, c, clock)
	scripted := testStore(t, client, goredisConn{client}, clock)
	ctx := t.Context()
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	resp := idem.Response{Status: 201, Header: map[string][]string{"A": {"b", ""}}, Body: []byte("body\x00")}
	var values []string
	for _, s := range []*Store{native, scripted} {
		cl, err := s.Claim(ctx, req)
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("Claim = %v, %v", cl.Outcome, err)
		}
		clock.Advance(time.Second)
		if err := s.Complete(ctx, idem.Ref{Scope: "s", Key: "k", Token: cl.Token}, resp); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		v, err := client.Get(ctx, recordKey(s.prefix, "s", "k")).Result()
		if err != nil {
			t.Fatal(err)
		}
		values = append(values, v)
		clock.Set(idemtest.Start)
	}
	if c.sets.Load() != 1 {
		t.Errorf("%d completions by IFEQ, want 1", c.sets.Load())
	}
	if values[0] != values[1] {
		t.Errorf("record completed by IFEQ:\n %q\nby the script:\n %q", values[0], values[1])
	}

	// A stale holder: the record was taken over, so IFEQ does not match and
	// the script refuses the old token.
	old, err := native.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "t", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	if err != nil || old.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", old.Outcome, err)
	}
	clock.Advance(time.Second)
	cur, err := native.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "t", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	if err != nil || !cur.TookOver {
		t.Fatalf("takeover Claim = %+v, %v", cur, err)
	}
	attempts := c.attempts.Load()
	if err := native.Complete(ctx, idem.Ref{Scope: "s", Key: "t", Token: old.Token}, resp); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete by the taken-over holder = %v, want ErrLeaseLost", err)
	}
	if c.attempts.Load() != attempts+1 {
		t.Errorf("the stale completion made %d IFEQ attempts, want 1 (refused)", c.attempts.Load()-attempts)
	}
	sets := c.sets.Load()
	if err := native.Complete(ctx, idem.Ref{Scope: "s", Key: "t", Token: cur.Token}, resp); err != nil {
		t.Errorf("Complete by the new holder = %v", err)
	}
	if c.sets.Load() != sets+1 {
		t.Error("the new holder's completion did not go through IFEQ")
	}
}
