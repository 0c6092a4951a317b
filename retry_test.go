package idem_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestRetryPolicyBounds(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, j := range []idem.Jitter{idem.FullJitter, idem.DecorrelatedJitter, idem.NoJitter} {
		p := idem.RetryPolicy{Base: 10 * time.Millisecond, Cap: time.Second, Jitter: j, Rand: rnd}
		var prev time.Duration
		for attempt := 1; attempt <= 200; attempt++ {
			d := p.Delay(attempt, prev)
			if d < 0 || d > time.Second {
				t.Fatalf("jitter %d attempt %d: delay %s outside [0, cap]", j, attempt, d)
			}
			if j == idem.DecorrelatedJitter && d < 10*time.Millisecond {
				t.Fatalf("decorrelated delay %s below base", d)
			}
			prev = d
		}
	}
}

func TestRetryPolicyExponential(t *testing.T) {
	t.Parallel()
	p := idem.RetryPolicy{Base: 100 * time.Millisecond, Cap: time.Second, Jitter: idem.NoJitter}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Delay(i+1, 0); got != w*time.Millisecond {
			t.Errorf("attempt %d: %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
	if got := p.Delay(1000, 0); got != time.Second {
		t.Errorf("attempt 1000: %s (overflow?)", got)
	}
}

func TestRetryPolicyDefaults(t *testing.T) {
	t.Parallel()
	var p idem.RetryPolicy
	if p.Attempts() != 10 {
		t.Fatalf("default attempts %d", p.Attempts())
	}
	if d := p.Delay(1, 0); d < 0 || d > 100*time.Millisecond {
		t.Fatalf("default first delay %s", d)
	}
}

// TestJitterSpreads is the retry-storm check: 1,000 clients that failed
// together must not retry together. Their delays are bucketed and no bucket
// may hold a large share of them.
func TestJitterSpreads(t *testing.T) {
	t.Parallel()
	for name, j := range map[string]idem.Jitter{"full": idem.FullJitter, "decorrelated": idem.DecorrelatedJitter} {
		t.Run(name, func(t *testing.T) {
			p := idem.RetryPolicy{Base: 100 * time.Millisecond, Cap: 10 * time.Second, Jitter: j, Rand: rand.New(rand.NewPCG(7, 11))}
			const clients, buckets = 1000, 20
			for attempt := 1; attempt <= 4; attempt++ {
				delays := make([]time.Duration, clients)
				var hi time.Duration
				for i := range delays {
					delays[i] = p.Delay(attempt, 0)
					hi = max(hi, delays[i])
				}
				var hist [buckets]int
				for _, d := range delays {
					hist[min(int(int64(d)*buckets/int64(hi+1)), buckets-1)]++
				}
				distinct := map[time.Duration]bool{}
				for _, d := range delays {
					distinct[d] = true
				}
				for b, n := range hist {
					// Uniform would put 50 in each bucket; lock-step would put 1,000 in one.
					if n > 3*clients/buckets {
						t.Fatalf("attempt %d: bucket %d holds %d of %d delays: %v", attempt, b, n, clients, hist)
					}
				}
				if len(distinct) < clients*9/10 {
					t.Fatalf("attempt %d: only %d distinct delays among %d clients", attempt, len(distinct), clients)
				}
			}
		})
	}
}
