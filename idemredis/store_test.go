package idemredis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

func redisURL(t testing.TB) string {
	t.Helper()
	return idemtest.RequireService(t, "Redis", redisEnv, defaultRedisURL)
}

// newClient returns a client of the test Redis, closed by t.Cleanup.
func newClient(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(redisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(opt)
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() { client.Close() })
	return client
}

// randomPrefix isolates a test's keys from every other test's.
func randomPrefix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	return "idemtest-" + hex.EncodeToString(b)
}

// newStore returns a Store on client; t.Cleanup closes it and deletes every
// key under its prefix. cfg.Prefix must be set.
func newStore(t testing.TB, client *redis.Client, cfg *idemredis.Config) *idemredis.Store {
	t.Helper()
	s, err := idemredis.NewStore(t.Context(), client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		deleteKeys(t, client, cfg.Prefix)
	})
	return s
}

func deleteKeys(t testing.TB, client *redis.Client, prefix string) {
	// t.Context is already cancelled when cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := client.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("listing the test's keys: %v", err)
		return
	}
	if len(keys) > 0 {
		if err := client.Unlink(ctx, keys...).Err(); err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	}
}

// newRueidisClient returns a rueidis client of the test Redis, closed by
// t.Cleanup.
func newRueidisClient(t testing.TB, opts ...func(*rueidis.ClientOption)) rueidis.Client {
	t.Helper()
	opt, err := rueidis.ParseURL(redisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableCache = true
	for _, o := range opts {
		o(&opt)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client
}

func claimReq(scope idem.Scope, key idem.Key, lease, ttl time.Duration) idem.ClaimRequest {
	return idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: lease, TTL: ttl}
}

func mustClaim(t *testing.T, s idem.Store, req idem.ClaimRequest, want idem.Outcome) idem.Claim {
	t.Helper()
	c, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", req.Scope, req.Key, err)
	}
	if c.Outcome != want {
		t.Fatalf("Claim(%q, %q) = %v, want %v", req.Scope, req.Key, c.Outcome, want)
	}
	return c
}

// The records are where doc.go says, with the scope as the hash tag, as
// strings that start with their state; nothing else is written, and a
// released record leaves its tombstone at its own key, for a while.
func TestKeysInRedis(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix})
	ctx := t.Context()
	scopes := map[idem.Scope]string{
		"tenant-a": "tenant-a",
		"":         "%",
		"a}b":      "a%7Db",
	}
	claims := make(map[idem.Scope]idem.Claim)
	for scope, tag := range scopes {
		claims[scope] = mustClaim(t, s, claimReq(scope, "k", time.Minute, time.Hour), idem.Acquired)
		want := prefix + ":{" + tag + "}:k"
		v, err := client.Get(ctx, want).Result()
		if err != nil || !strings.HasPrefix(v, "i") {
			t.Errorf("scope %q: GET %s = %q, %v; want an in-flight record", scope, want, v, err)
		}
	}
	listKeys := func() []string {
		t.Helper()
		var keys []string
		iter := client.Scan(ctx, 0, prefix+":*", 100).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if keys := listKeys(); len(keys) != 3 {
		t.Errorf("keys under the prefix: %q; want the 3 records", keys)
	}

	c := claims["a}b"]
	if err := s.Release(ctx, idem.Ref{Scope: "a}b", Key: "k", Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	rk := prefix + ":{a%7Db}:k"
	if v, err := client.Get(ctx, rk).Result(); err != nil || v != fmt.Sprint("r-", c.Token) {
		t.Errorf("GET %s after Release = %q, %v; want the tombstone r-%d", rk, v, err, c.Token)
	}
	if d, err := client.PTTL(ctx, rk).Result(); err != nil || d <= 0 || d > 10*time.Second {
		t.Errorf("PTTL of the tombstone = %v, %v; want at most 10s", d, err)
	}
	if keys := listKeys(); len(keys) != 3 {
		t.Errorf("keys under the prefix after a Release: %q; want 2 records and 1 tombstone", keys)
	}
}

// commandLog records the commands a client sends.
type commandLog struct {
	mu   sync.Mutex
	cmds []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.mu.Lock()
		l.cmds = append(l.cmds, cmd.FullName())
		l.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.mu.Lock()
		l.cmds = append(l.cmds, "pipeline")
		l.mu.Unlock()
		return next(ctx, cmds)
	}
}

// take returns the commands sent since the last take, but TIME and the
// handshake of a new connection: the store refreshes its estimate of
// Redis's clock in the background, apart from the calls a test counts.
func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var cmds []string
	for _, c := range l.cmds {
		if c != "time" && c != "hello" && !strings.HasPrefix(c, "client ") {
			cmds = append(cmds, c)
		}
	}
	l.cmds = nil
	return cmds
}

// Each call is one round trip, and the common ones are one native command:
// a new key's claim, a duplicate's, a replay and a Get. On this Redis
// (without SET … IFEQ) a completion is one EVALSHA, as are a release and a
// takeover after the native claim found the lease ended.
func TestOneRoundTripEach(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	log := &commandLog{}
	client.AddHook(log)
	clock := idemmem.NewClock(idemtest.Start)
	for _, tc := range []struct {
		name  string
		clock idem.Clock
	}{{"server clock", nil}, {"injected clock", clock}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, client, &idemredis.Config{Prefix: randomPrefix(t), Clock: tc.clock})
			log.take()
			req := claimReq("s", "k", time.Minute, time.Hour)
			var c idem.Claim
			steps := []struct {
				name string
				run  func() error
				want string
			}{
				{"first Claim", func() (err error) { c, err = s.Claim(t.Context(), req); return err }, "set"},
				{"duplicate Claim", func() error { _, err := s.Claim(t.Context(), req); return err }, "set"},
				{"Complete", func() error {
					return s.Complete(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: c.Token}, idem.Response{Status: 200})
				}, "evalsha"},
				{"replaying Claim", func() error { _, err := s.Claim(t.Context(), req); return err }, "set"},
				{"Get", func() error { _, err := s.Get(t.Context(), "s", "k"); return err }, "get"},
			}
			for _, st := range steps {
				if err := st.run(); err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				if cmds := log.take(); len(cmds) != 1 || cmds[0] != st.want {
					t.Errorf("%s sent %q, want one %s", st.name, cmds, st.want)
				}
			}
			if c.Outcome != idem.Acquired {
				t.Fatalf("first Claim = %v", c.Outcome)
			}
		})
	}
}

// A duplicate waiting on one replica is woken by the first request
// completing on another: two Stores, two clients, one Redis.
func TestWaitChangeWokenByAnotherStore(t *testing.T) {
	t.Parallel()
	prefix := randomPrefix(t)
	first := newStore(t, newClient(t), &idemredis.Config{Prefix: prefix})

	// The waiter's client reports when the WaitChange has read the record
	// (its only script call), so the Complete below surely comes after it:
	// only a published change can then wake the waiter before the lease
	// (a minute) ends.
	checked := make(chan struct{}, 1)
	waiterClient := newClient(t)
	waiterClient.AddHook(afterCommand("evalsha", func() { notifyOnce(checked) }))
	waiter := newStore(t, waiterClient, &idemredis.Config{Prefix: prefix})

	req := claimReq("s", "k", time.Minute, time.Hour)
	c := mustClaim(t, first, req, idem.Acquired)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waiter.WaitChange(ctx, req.Scope, req.Key) }()
	select {
	case <-checked:
	case err := <-done:
		t.Fatalf("WaitChange returned %v before the key changed", err)
	}
	select {
	case err := <-done:
		t.Fatalf("WaitChange returned %v before the key changed", err)
	default:
	}
	if err := first.Complete(t.Context(), idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}, idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WaitChange = %v, want nil once the other store completed the key", err)
	}
	mustClaim(t, waiter, req, idem.Completed)
}

// Changes are published only for records a WaitChange waits on: a first
// execution nobody waits for costs no PUBLISH, and a waited-on completion
// or release is published once the waiter has flagged the record.
func TestChangesPublishedOnlyWhenWaited(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix})
	ctx := t.Context()
	sub := newClient(t).Subscribe(ctx, prefix+":changes")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	next := func(within time.Duration) (string, bool) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		m, err := sub.ReceiveMessage(rctx)
		if err != nil {
			return "", false
		}
		return m.Payload, true
	}

	// Nobody waits: claim and complete one key, release another.
	done := mustClaim(t, s, claimReq("s", "done", time.Minute, time.Hour), idem.Acquired)
	if err := s.Complete(ctx, idem.Ref{Scope: "s", Key: "done", Token: done.Token}, idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	gone := mustClaim(t, s, claimReq("s", "gone", time.Minute, time.Hour), idem.Acquired)
	if err := s.Release(ctx, idem.Ref{Scope: "s", Key: "gone", Token: gone.Token}); err != nil {
		t.Fatal(err)
	}
	// A marker published by hand: had the store published anything, it
	// would arrive first.
	if err := client.Publish(ctx, prefix+":changes", "marker").Err(); err != nil {
		t.Fatal(err)
	}
	if got, ok := next(5 * time.Second); got != "marker" {
		t.Errorf("first message = %q, %v; want the marker: a change nobody waited on was published", got, ok)
	}

	// A waiter on each key: both changes are published.
	for _, tc := range []struct {
		key    idem.Key
		change func(idem.Claim) error
	}{
		{"waited-done", func(c idem.Claim) error {
			return s.Complete(ctx, idem.Ref{Scope: "s", Key: c.Record.Key, Token: c.Token}, idem.Response{Status: 200})
		}},
		{"waited-gone", func(c idem.Claim) error {
			return s.Release(ctx, idem.Ref{Scope: "s", Key: c.Record.Key, Token: c.Token})
		}},
	} {
		c := mustClaim(t, s, claimReq("s", tc.key, time.Minute, time.Hour), idem.Acquired)
		wctx, cancel := context.WithCancel(ctx)
		waited := make(chan error, 1)
		go func() { waited <- s.WaitChange(wctx, "s", tc.key) }()
		// The record is flagged once the waiter has read it.
		deadline := time.Now().Add(5 * time.Second)
		for {
			v, err := client.GetRange(ctx, prefix+":{s}:"+string(tc.key), 1, 1).Result()
			if err != nil {
				t.Fatal(err)
			}
			if v == "w" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the waiter did not flag the record within 5s", tc.key)
			}
			time.Sleep(5 * time.Millisecond) // poll interval, bounded by the deadline
		}
		if err := tc.change(c); err != nil {
			t.Fatal(err)
		}
		if got, ok := next(5 * time.Second); got != prefix+":{s}:"+string(tc.key) {
			t.Errorf("%s: message = %q, %v; want the record's key", tc.key, got, ok)
		}
		if err := <-waited; err != nil {
			t.Errorf("%s: WaitChange = %v, want nil", tc.key, err)
		}
		cancel()
	}
}

// When the subscription's connection drops, changes published meanwhile
// are lost, so every waiter is woken once it is back: with either client.
func TestWaitChangeWokenByReconnect(t *testing.T) {
	t.Parallel()
	for _, client := range []string{"go-redis", "rueidis"} {
		t.Run(client, func(t *testing.T) {
			t.Parallel()
			name := randomPrefix(t)
			prefix := randomPrefix(t)
			admin := newClient(t)
			var s *idemredis.Store
			var err error
			if client == "go-redis" {
				s, err = idemredis.NewStore(t.Context(), newClient(t, func(o *redis.Options) { o.ClientName = name }), &idemredis.Config{Prefix: prefix})
			} else {
				s, err = idemredis.NewRueidisStore(t.Context(), newRueidisClient(t, func(o *rueidis.ClientOption) { o.ClientName = name }), &idemredis.Config{Prefix: prefix})
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				deleteKeys(t, admin, prefix)
			})
			req := claimReq("s", "k", time.Minute, time.Hour)
			mustClaim(t, s, req, idem.Acquired)

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.WaitChange(ctx, req.Scope, req.Key) }()
			waitFlagged(t, admin, prefix+":{s}:k", done)

			// Kill only this test's subscription connection.
			list, err := admin.ClientList(t.Context()).Result()
			if err != nil {
				t.Fatal(err)
			}
			killed := 0
			for line := range strings.SplitSeq(list, "\n") {
				if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " sub=1 ") {
					id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
					if err := admin.Do(t.Context(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
						t.Fatal(err)
					}
					killed++
				}
			}
			if killed != 1 {
				t.Fatalf("found %d subscription connections named %s, want 1:\n%s", killed, name, list)
			}
			if err := <-done; err != nil {
				t.Fatalf("WaitChange = %v, want nil after the subscription reconnected", err)
			}
			// The subscription is back: a waiter is woken by a change again.
			c := mustClaim(t, s, claimReq("s", "k2", time.Minute, time.Hour), idem.Acquired)
			go func() { done <- s.WaitChange(ctx, "s", "k2") }()
			waitFlagged(t, admin, prefix+":{s}:k2", done)
			if err := s.Release(t.Context(), idem.Ref{Scope: "s", Key: "k2", Token: c.Token}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("WaitChange after the reconnection = %v, want nil once the key was released", err)
			}
		})
	}
}

// waitFlagged polls, with a deadline, until a WaitChange has flagged the
// record at rk (it then waits on the subscription), failing if the
// WaitChange returns first.
func waitFlagged(t *testing.T, client *redis.Client, rk string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("WaitChange returned %v before the key changed", err)
		default:
		}
		v, err := client.GetRange(t.Context(), rk, 1, 1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if v == "w" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter did not flag %s within 5s", rk)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// afterCommand is a hook that calls fn after each command named name.
type afterCommandHook struct {
	name string
	fn   func()
}

func afterCommand(name string, fn func()) redis.Hook { return afterCommandHook{name, fn} }

func (h afterCommandHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h afterCommandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h afterCommandHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.FullName() == h.name {
			h.fn()
		}
		return err
	}
}

func notifyOnce(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// With no injected clock, the Redis server's clock ends leases: a short
// lease ends in real time, WaitChange returns when it does, the next Claim
// (native, then the script, which judges the lease by Redis's TIME) takes
// the key over, and the first holder's completion is refused.
func TestLeaseEndsInRealTime(t *testing.T) {
	t.Parallel()
	s := newStore(t, newClient(t), &idemredis.Config{Prefix: randomPrefix(t)})
	const lease = 200 * time.Millisecond
	req := claimReq("s", "k", lease, time.Minute)
	first := mustClaim(t, s, req, idem.Acquired)
	if d := first.Record.LeaseExpiresAt.Sub(first.Record.CreatedAt); d != lease {
		t.Errorf("LeaseExpiresAt - CreatedAt = %v, want %v", d, lease)
	}
	if skew := time.Since(first.Record.CreatedAt); skew < -time.Minute || skew > time.Minute {
		t.Errorf("CreatedAt = %v, far from the local clock %v: not the server's time?", first.Record.CreatedAt, time.Now())
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
		t.Fatalf("WaitChange until the lease ended = %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := s.Claim(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if c.Outcome == idem.Acquired {
			if !c.TookOver || c.Token <= first.Token {
				t.Errorf("claim after the lease = TookOver %v, token %d; want a takeover with a token above %d", c.TookOver, c.Token, first.Token)
			}
			// Fencing holds: the first holder can no longer complete.
			if err := s.Complete(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: first.Token}, idem.Response{Status: 200}); !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("Complete by the taken-over holder = %v, want ErrLeaseLost", err)
			}
			if err := s.Complete(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: c.Token}, idem.Response{Status: 201}); err != nil {
				t.Errorf("Complete by the new holder = %v", err)
			}
			break
		}
		if c.Outcome != idem.InFlight {
			t.Fatalf("Claim = %v, want in_flight then acquired", c.Outcome)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease of %v had not ended 5s later", lease)
		}
		time.Sleep(10 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// Every record carries a Redis TTL, so Redis evicts it without Purge: the
// TTL is relative to the store's clock (an injected clock far from real time
// must not make Redis evict at once or never), and it covers a lease that
// outlives the record's TTL.
func TestRecordsExpireInRedis(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	clock := idemmem.NewClock(idemtest.Start.AddDate(-40, 0, 0)) // 1990: already past in real time
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix, Clock: clock})
	ctx := t.Context()

	pttl := func(key idem.Key) time.Duration {
		t.Helper()
		d, err := client.PTTL(ctx, prefix+":{s}:"+string(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	within := func(what string, got, lo, hi time.Duration) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s: PTTL = %v, want between %v and %v", what, got, lo, hi)
		}
	}

	c := mustClaim(t, s, claimReq("s", "a", time.Second, time.Minute), idem.Acquired)
	within("new record", pttl("a"), 50*time.Second, 62*time.Second)
	if err := s.Complete(ctx, idem.Ref{Scope: "s", Key: "a", Token: c.Token}, idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	within("completed record", pttl("a"), 50*time.Second, 62*time.Second)

	// The scripts judge expiry by the injected clock, not by Redis's TTL.
	mustClaim(t, s, claimReq("s", "b", time.Second, time.Minute), idem.Acquired)
	clock.Advance(2 * time.Minute)
	if _, err := s.Get(ctx, "s", "b"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get of a record dead by the injected clock = %v, want ErrNotFound", err)
	}
	if n, err := client.Exists(ctx, prefix+":{s}:b").Result(); err != nil || n != 1 {
		t.Errorf("EXISTS of the record Redis has not evicted yet = %d, %v; want 1", n, err)
	}

	// A sub-millisecond lease and TTL still give a positive TTL.
	mustClaim(t, s, claimReq("s", "tiny", time.Microsecond, time.Microsecond), idem.Acquired)
	within("tiny record", pttl("tiny"), time.Millisecond, 2*time.Second)

	// A released record leaves only its tombstone, for 10s.
	r := mustClaim(t, s, claimReq("s", "released", time.Second, time.Minute), idem.Acquired)
	if err := s.Release(ctx, idem.Ref{Scope: "s", Key: "released", Token: r.Token}); err != nil {
		t.Fatal(err)
	}
	if v, err := client.Get(ctx, prefix+":{s}:released").Result(); err != nil || v != fmt.Sprint("r-", r.Token) {
		t.Errorf("GET after Release = %q, %v; want the tombstone", v, err)
	}
	within("tombstone", pttl("released"), 8*time.Second, 10*time.Second)
}

func TestTakeoverExtendsRedisTTL(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	clock := idemmem.NewClock(idemtest.Start)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix, Clock: clock})
	mustClaim(t, s, claimReq("s", "k", time.Second, 2*time.Second), idem.Acquired)
	clock.Advance(time.Second)
	// The takeover's lease ends 10s from now, long after the record's TTL
	// (1s from now): Redis must keep the record as long as the lease.
	if c := mustClaim(t, s, claimReq("s", "k", 10*time.Second, 10*time.Second), idem.Acquired); !c.TookOver {
		t.Fatal("expected a takeover")
	}
	d, err := client.PTTL(t.Context(), prefix+":{s}:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if d < 9*time.Second || d > 11*time.Second+100*time.Millisecond {
		t.Errorf("PTTL after a takeover = %v, want about 10s (the new lease) and a little", d)
	}
}

func TestTokensIncreaseAcrossExpiryAndClockSteps(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(idemtest.Start)
	s := newStore(t, newClient(t), &idemredis.Config{Prefix: randomPrefix(t), Clock: clock})
	ctx := t.Context()
	req := claimReq("s", "k", time.Second, time.Minute)
	var last idem.Token
	for i := range 6 {
		c := mustClaim(t, s, req, idem.Acquired)
		if c.Token <= last {
			t.Fatalf("claim %d: token %d is not greater than %d", i, c.Token, last)
		}
		last = c.Token
		switch i % 3 {
		case 0: // released, then the clock steps back
			if err := s.Release(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}); err != nil {
				t.Fatal(err)
			}
			clock.Advance(-3 * time.Hour)
		case 1: // expired and purged, then the clock steps back
			clock.Advance(time.Hour)
			if n, err := s.Purge(ctx, 10); err != nil || n != 1 {
				t.Fatalf("Purge = %d, %v; want 1", n, err)
			}
			clock.Advance(-3 * time.Hour)
		case 2: // expired, and replaced by the next claim
			clock.Advance(time.Hour)
		}
	}
}

// With the server's clock, a key that Redis has expired (here deleted, as
// its expiry would, though sooner) is claimed anew with a greater token:
// the clock has moved past the expired record's token, and a process's
// estimate never goes back.
func TestTokensIncreaseAfterRedisExpiry(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix})
	req := claimReq("s", "k", time.Millisecond, time.Millisecond)
	var last idem.Token
	for i := range 3 {
		c := mustClaim(t, s, req, idem.Acquired)
		if c.Token <= last {
			t.Fatalf("claim %d: token %d is not greater than %d", i, c.Token, last)
		}
		last = c.Token
		if err := client.Del(t.Context(), prefix+":{s}:k").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if keys, _ := client.Keys(t.Context(), prefix+":*").Result(); len(keys) != 0 {
		t.Errorf("keys under the prefix: %q; want none: the record was deleted, and nothing else is written", keys)
	}
}

// A token ahead of the server's clock (left by a takeover while the clock
// was behind) decides the key's next tokens, and Redis keeps it, in the
// record or its tombstone, until the clock has passed it: so tokens keep
// increasing however the key is released and claimed again.
func TestTokenAheadOfClock(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix})
	ctx := t.Context()
	rk := prefix + ":{s}:k"
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := client.Set(ctx, rk, fmt.Sprint("r-", ahead), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	last := idem.Token(ahead)
	for i := range 3 {
		c := mustClaim(t, s, claimReq("s", "k", time.Minute, time.Hour), idem.Acquired)
		if c.Token <= last {
			t.Fatalf("claim %d: token %d, want above %d", i, c.Token, last)
		}
		last = c.Token
		if d, err := client.PTTL(ctx, rk).Result(); err != nil || d < time.Hour {
			t.Errorf("claim %d: PTTL = %v, %v; want over an hour, until the clock passes the token", i, d, err)
		}
		if err := s.Release(ctx, idem.Ref{Scope: "s", Key: "k", Token: c.Token}); err != nil {
			t.Fatal(err)
		}
		if d, err := client.PTTL(ctx, rk).Result(); err != nil || d < time.Hour {
			t.Errorf("claim %d: the tombstone's PTTL = %v, %v; want over an hour", i, d, err)
		}
	}
}

// With the server's clock, Redis evicts records by itself and Purge finds
// nothing; keys under the prefix that are not records are left alone.
func TestPurgeWithServerClock(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix})
	ctx := t.Context()
	mustClaim(t, s, claimReq("s", "live", time.Minute, time.Hour), idem.Acquired)
	if err := client.Set(ctx, prefix+":{s}:not-a-record", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, 10); err != nil || n != 0 {
		t.Errorf("Purge = %d, %v; want 0, nil", n, err)
	}
	if _, err := s.Get(ctx, "s", "live"); err != nil {
		t.Errorf("Get of the live record after Purge: %v", err)
	}
	if n, _ := client.Exists(ctx, prefix+":{s}:not-a-record").Result(); n != 1 {
		t.Error("Purge deleted a key that is not a record")
	}
	if _, err := s.Purge(ctx, 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Purge(0) = %v, want ErrInvalidArgument", err)
	}
}

func TestOpen(t *testing.T) {
	t.Parallel()
	url := redisURL(t)
	prefix := randomPrefix(t)
	cleaner := newClient(t)
	t.Cleanup(func() { deleteKeys(t, cleaner, prefix) })
	s, err := idemredis.Open(t.Context(), url, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("Open(%q): %v", url, err)
	}
	req := claimReq("s", "k", time.Minute, time.Hour)
	c := mustClaim(t, s, req, idem.Acquired)
	if err := s.Release(t.Context(), idem.Ref{Scope: "s", Key: "k", Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	// Open owns its client (rueidis): Close closed it.
	if _, err := s.Claim(t.Context(), req); err == nil || !errors.Is(err, rueidis.ErrClosing) {
		t.Errorf("Claim after Close = %v, want an error matching rueidis.ErrClosing", err)
	}
}

func TestOpenBadURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url  string
		want string
	}{
		{"http://127.0.0.1:6379", "invalid URL scheme"},
		{"redis://user:s3cret@127.0.0.1:6379/zero", "invalid database number"},
		{"redis://user:s3cret@[::1", "missing ']'"},
		{"127.0.0.1:6379", "first path segment in URL cannot contain colon"},
		// Parses, but nothing listens there.
		{"redis://user:s3cret@127.0.0.1:1/0?dial_timeout=2s&max_retries=-1", "connect"},
	}
	for _, tc := range cases {
		s, err := idemredis.Open(t.Context(), tc.url, nil)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded, want an error", tc.url)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "idemredis: ") || !strings.Contains(msg, tc.want) {
			t.Errorf("Open(%q) = %q, want an idemredis error mentioning %q", tc.url, msg, tc.want)
		}
		if strings.Contains(msg, "s3cret") {
			t.Errorf("Open(%q) = %q: the error shows the password", tc.url, msg)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": client.Options().Addr}})
	t.Cleanup(func() { ring.Close() })
	cases := []struct {
		name   string
		client redis.UniversalClient
		cfg    *idemredis.Config
	}{
		{"nil client", nil, nil},
		{"brace in prefix", client, &idemredis.Config{Prefix: "app{1}"}},
		{"ring", ring, nil},
	}
	for _, tc := range cases {
		s, err := idemredis.NewStore(t.Context(), tc.client, tc.cfg)
		if !errors.Is(err, idem.ErrInvalidArgument) {
			if s != nil {
				s.Close()
			}
			t.Errorf("%s: New = %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s, err := idemredis.NewStore(t.Context(), client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteKeys(t, client, prefix) })
	req := claimReq("s", "k", time.Minute, time.Hour)
	mustClaim(t, s, req, idem.Acquired)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 3 {
		wg.Go(func() {
			// A waiter returns an error when the store closes under it
			// (or if it starts waiting after that).
			for ctx.Err() == nil {
				if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					return
				}
			}
		})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if failed.Load() != 3 {
		t.Errorf("%d of 3 waiters returned an error when the store closed, want 3", failed.Load())
	}
	if err := s.WaitChange(t.Context(), req.Scope, req.Key); err == nil {
		t.Error("WaitChange after Close = nil, want an error")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	// The client is the caller's: it still works.
	if err := client.Ping(t.Context()).Err(); err != nil {
		t.Errorf("the caller's client after Close: %v", err)
	}
}
