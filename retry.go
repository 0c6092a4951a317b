package idem

import (
	"math/rand/v2"
	"time"
)

// Jitter chooses how a RetryPolicy spreads its delays. Without jitter,
// clients that failed together retry together, and the dependency they wait
// on is hit by a retry storm the moment it recovers. The strategies are
// those of Marc Brooker's "Exponential Backoff And Jitter".
type Jitter int

const (
	// FullJitter waits a uniformly random time between zero and the
	// exponential delay, min(Cap, Base·2^(attempt-1)). The default: it
	// spreads retries the most for the least total work.
	FullJitter Jitter = iota
	// DecorrelatedJitter waits a uniformly random time between Base and
	// three times the previous delay, capped at Cap.
	DecorrelatedJitter
	// NoJitter waits exactly the exponential delay. Only for tests and for
	// the rare caller that retries alone.
	NoJitter
)

// Rand is the source of randomness a RetryPolicy draws from; *rand.Rand of
// math/rand/v2 satisfies it, so tests can inject a seeded one.
type Rand interface {
	Int64N(n int64) int64
}

type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// RetryPolicy bounds retries and spaces them with jittered exponential
// backoff. The zero value is usable: every field has a default.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts in all, the first included.
	// Defaults to 10.
	MaxAttempts int
	// Base is the first delay's scale. Defaults to 100ms.
	Base time.Duration
	// Cap bounds every delay. Defaults to 30s.
	Cap time.Duration
	// Jitter is the spreading strategy. Defaults to FullJitter.
	Jitter Jitter
	// Rand is the randomness. Defaults to math/rand/v2's global source.
	Rand Rand
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 10
	}
	if p.Base <= 0 {
		p.Base = 100 * time.Millisecond
	}
	if p.Cap <= 0 {
		p.Cap = 30 * time.Second
	}
	if p.Cap < p.Base {
		p.Cap = p.Base
	}
	if p.Rand == nil {
		p.Rand = globalRand{}
	}
	return p
}

// Attempts returns MaxAttempts with its default applied.
func (p RetryPolicy) Attempts() int { return p.withDefaults().MaxAttempts }

// Delay returns how long to wait before the next attempt, after the
// attempt-th attempt failed (attempt counts from 1). prev is the delay used
// before the failed attempt (zero after the first); DecorrelatedJitter
// needs it, the other strategies ignore it.
func (p RetryPolicy) Delay(attempt int, prev time.Duration) time.Duration {
	p = p.withDefaults()
	if attempt < 1 {
		attempt = 1
	}
	switch p.Jitter {
	case DecorrelatedJitter:
		hi := 3 * prev
		if prev <= 0 || hi < p.Base { // first retry, or overflow
			hi = 3 * p.Base
		}
		hi = min(hi, p.Cap)
		if hi <= p.Base {
			return p.Base
		}
		return p.Base + time.Duration(p.Rand.Int64N(int64(hi-p.Base)+1))
	case NoJitter:
		return p.exponential(attempt)
	default:
		return time.Duration(p.Rand.Int64N(int64(p.exponential(attempt)) + 1))
	}
}

// exponential is min(Cap, Base·2^(attempt-1)), without overflow.
func (p RetryPolicy) exponential(attempt int) time.Duration {
	d := p.Base
	for i := 1; i < attempt; i++ {
		if d > p.Cap-d { // 2d > Cap, without overflow (d <= Cap here)
			return p.Cap
		}
		d *= 2
	}
	return min(d, p.Cap)
}
