package idemredis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
)

// commandNames records the names of the commands a go-redis client sends.
type commandNames struct {
	mu    sync.Mutex
	names []string
}

func (c *commandNames) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *commandNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.names = append(c.names, cmd.Name())
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

// take returns the commands since the last take, but the background
// refresh's TIME and the handshake of the connection it may open.
func (c *commandNames) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.names {
		if n != "time" && n != "hello" && n != "client" {
			out = append(out, n)
		}
	}
	c.names = nil
	return out
}

// While the process has no usable estimate of Redis's clock, a new key's
// claim is the claim script, which reads TIME itself; the claim that finds
// the estimate stale starts a refresh, after which claims are native again.
func TestClaimWithoutEstimate(t *testing.T) {
	t.Parallel()
	client := testClient(t)
	log := &commandNames{}
	client.AddHook(log)
	s := testStore(t, client, goredisConn{client}, nil)
	stale := *s.server.sample.Load()
	stale.local = stale.local.Add(-time.Hour)
	s.server.sample.Store(&stale)
	log.take()

	req := idem.ClaimRequest{Scope: "s", Key: "a", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(t.Context(), req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", c.Outcome, err)
	}
	if got := log.take(); len(got) != 1 || got[0] != "evalsha" {
		t.Errorf("claim without an estimate sent %q, want one evalsha", got)
	}
	if skew := time.Since(c.Record.CreatedAt); skew < -time.Minute || skew > time.Minute {
		t.Errorf("CreatedAt = %v, far from now: not Redis's TIME?", c.Record.CreatedAt)
	}
	waitFor(t, func() bool { _, ok := s.server.now(); return ok })
	req.Key = "b"
	if c, err := s.Claim(t.Context(), req); err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", c.Outcome, err)
	}
	if got := log.take(); len(got) != 1 || got[0] != "set" {
		t.Errorf("claim with a fresh estimate sent %q, want one set", got)
	}
}
