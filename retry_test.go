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

// recordingRand returns the largest value it may and records each bound it
// is asked for, so a test sees the exact range a delay is drawn from.
type recordingRand struct{ bounds []int64 }

func (r *recordingRand) Int64N(n int64) int64 {
	r.bounds = append(r.bounds, n)
	return n - 1
}

// TestRetryPolicyDefaultValues protects the documented defaults of the zero
// RetryPolicy: a 100ms base and a 30s cap.
func TestRetryPolicyDefaultValues(t *testing.T) {
	t.Parallel()
	p := idem.RetryPolicy{Jitter: idem.NoJitter}
	if got := p.Delay(1, 0); got != 100*time.Millisecond {
		t.Errorf("first delay of the zero policy = %s, want the 100ms base", got)
	}
	if got := p.Delay(50, 0); got != 30*time.Second {
		t.Errorf("50th delay of the zero policy = %s, want the 30s cap", got)
	}
	// A cap below the base is raised to it: every delay is the base.
	p = idem.RetryPolicy{Base: time.Second, Cap: 100 * time.Millisecond, Jitter: idem.NoJitter}
	for _, attempt := range []int{1, 2, 5} {
		if got := p.Delay(attempt, 0); got != time.Second {
			t.Errorf("cap below base, attempt %d: %s, want the 1s base", attempt, got)
		}
	}
}

// TestDecorrelatedJitterRange protects DecorrelatedJitter's range: between
// Base and three times the previous delay (three times Base on the first
// retry, or when the previous delay is too small or overflows), capped, and
// no random draw at all when that range is the single value Base.
func TestDecorrelatedJitterRange(t *testing.T) {
	t.Parallel()
	const base = 90 * time.Millisecond
	tests := []struct {
		name      string
		prev, cap time.Duration
		bound     int64 // the n of Int64N; 0 for no draw
		want      time.Duration
	}{
		{name: "first retry", prev: 0, cap: 10 * time.Second, bound: int64(2*base) + 1, want: 3 * base},
		{name: "three times the previous delay", prev: time.Second, cap: 10 * time.Second, bound: int64(3*time.Second-base) + 1, want: 3 * time.Second},
		{name: "capped", prev: time.Second, cap: 2 * time.Second, bound: int64(2*time.Second-base) + 1, want: 2 * time.Second},
		{name: "previous below a third of base", prev: 20 * time.Millisecond, cap: 10 * time.Second, bound: int64(2*base) + 1, want: 3 * base},
		{name: "previous exactly a third of base", prev: base / 3, cap: 10 * time.Second, want: base},
		{name: "previous overflows when tripled", prev: time.Duration(1<<62 - 1), cap: 10 * time.Second, bound: int64(2*base) + 1, want: 3 * base},
		{name: "cap equal to base", prev: time.Second, cap: base, want: base},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recordingRand{}
			p := idem.RetryPolicy{Base: base, Cap: tt.cap, Jitter: idem.DecorrelatedJitter, Rand: r}
			got := p.Delay(2, tt.prev)
			if got != tt.want {
				t.Errorf("Delay(2, %s) = %s, want %s", tt.prev, got, tt.want)
			}
			switch {
			case tt.bound == 0 && len(r.bounds) != 0:
				t.Errorf("drew Int64N%v for a range of one value", r.bounds)
			case tt.bound != 0 && (len(r.bounds) != 1 || r.bounds[0] != tt.bound):
				t.Errorf("drew Int64N%v, want Int64N([%d])", r.bounds, tt.bound)
			}
		})
	}
}

// TestFullJitterRange protects FullJitter's range: from zero up to and
// including the exponential delay.
func TestFullJitterRange(t *testing.T) {
	t.Parallel()
	r := &recordingRand{}
	p := idem.RetryPolicy{Base: 100 * time.Millisecond, Cap: time.Second, Rand: r}
	if got := p.Delay(3, 0); got != 400*time.Millisecond {
		t.Errorf("largest full-jitter delay after attempt 3 = %s, want the exponential 400ms", got)
	}
	if want := int64(400*time.Millisecond) + 1; len(r.bounds) != 1 || r.bounds[0] != want {
		t.Errorf("drew Int64N%v, want Int64N([%d])", r.bounds, want)
	}
}

// TestRetryPolicyExponentialIsMinOfCapAndDoubling protects the documented
// exponential delay, min(Cap, Base·2^(attempt-1)), exactly: with a cap that
// doubling falls just short of, the delay is the doubled base, not the cap.
func TestRetryPolicyExponentialIsMinOfCapAndDoubling(t *testing.T) {
	t.Parallel()
	p := idem.RetryPolicy{Base: 50 * time.Millisecond, Cap: 100*time.Millisecond + 1, Jitter: idem.NoJitter}
	for attempt, want := range map[int]time.Duration{1: 50 * time.Millisecond, 2: 100 * time.Millisecond, 3: 100*time.Millisecond + 1} {
		if got := p.Delay(attempt, 0); got != want {
			t.Errorf("attempt %d: %s, want %s", attempt, got, want)
		}
	}
}
