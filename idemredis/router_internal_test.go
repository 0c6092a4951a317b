package idemredis

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// routedClient is a rueidis client as Open makes it: commands on
// connections of their own unless they are marked for the pipeline.
func routedClient(t *testing.T) rueidis.Client {
	t.Helper()
	url := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableCache = true
	opt.DisableAutoPipelining = true
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client
}

// The conformance suite on a store whose router lets one command at a
// time go on a connection of its own, so that the suite's concurrent
// claims take both routes.
func TestStoreRouted(t *testing.T) {
	t.Parallel()
	client := routedClient(t)
	cleaner := testClient(t)
	var direct, piped atomic.Int64
	route := &router{direct: 1, routed: func(p bool) {
		if p {
			piped.Add(1)
		} else {
			direct.Add(1)
		}
	}}
	t.Cleanup(func() {
		if direct.Load() == 0 || piped.Load() == 0 {
			t.Errorf("commands on their own connections: %d, on the pipeline: %d; want both", direct.Load(), piped.Load())
		}
	})
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return testStore(t, cleaner, rueidisConn{c: client, route: route}, clock)
	})
}

// The router counts what is in flight: while two claims are held on their
// own connections, a third goes on the pipeline; once all are answered the
// count is back to zero, and the next claim goes direct again.
func TestRouterInFlight(t *testing.T) {
	t.Parallel()
	client := routedClient(t)
	pipeUsed := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var routes []bool
	route := &router{direct: 2}
	route.routed = func(p bool) {
		mu.Lock()
		routes = append(routes, p)
		mu.Unlock()
		if p {
			once.Do(func() { close(pipeUsed) })
			return
		}
		if route.inflight.Load() <= route.direct {
			select { // hold the direct ones until the third is piped
			case <-pipeUsed:
			case <-time.After(10 * time.Second):
			}
		}
	}
	s := testStore(t, testClient(t), rueidisConn{c: client, route: route}, nil)
	claim := func() {
		req := idem.ClaimRequest{Scope: "s", Key: idem.Key(rand.Text()), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		if c, err := s.Claim(t.Context(), req); err != nil || c.Outcome != idem.Acquired {
			t.Errorf("claim: %v, %v", c.Outcome, err)
		}
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(claim)
	}
	wg.Wait()
	if n := route.inflight.Load(); n != 0 {
		t.Errorf("in flight after every claim was answered: %d", n)
	}
	select {
	case <-pipeUsed:
	default:
		t.Fatalf("three claims in flight, two allowed direct: routes %v, none piped", routes)
	}
	mu.Lock()
	routes = nil
	mu.Unlock()
	claim()
	if len(routes) != 1 || routes[0] {
		t.Errorf("a claim alone: routes %v, want one direct", routes)
	}
}

// A script Redis does not have (flushed, or a server restarted without
// persistence) runs by EVAL after EVALSHA's NOSCRIPT, on either route.
func TestEvalWithoutLoadedScript(t *testing.T) {
	t.Parallel()
	client := routedClient(t)
	b := make([]byte, 8)
	rand.Read(b)
	// A source no other test loads: its SHA-1 is unknown to Redis.
	sc := newScript("-- " + hex.EncodeToString(b) + "\nreturn tonumber(ARGV[1]) + 1")
	for _, direct := range []int32{16, 0} {
		c := rueidisConn{c: client, route: &router{direct: direct}}
		n, err := c.evalInt(t.Context(), sc, []string{"idemtest-noscript-" + hex.EncodeToString(b)}, "41")
		if err != nil || n != 42 {
			t.Errorf("direct %d: evalInt = %d, %v; want 42", direct, n, err)
		}
	}
}
