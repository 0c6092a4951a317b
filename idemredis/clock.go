package idemredis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// How the process estimates Redis's clock (see doc.go, "Time"). The
// estimate is refreshed once it is older than clockRefresh, by the first
// claim to notice, in the background; it is not used at all once it is
// older than clockMaxAge, or when the TIME call that measured it took
// longer than clockMaxRTT, and the claim is then judged by a script
// reading TIME, as every claim was before.
const (
	clockRefresh = time.Second
	clockMaxAge  = 2 * time.Second
	// clockMaxRTT bounds the error of an estimate that is used: far below
	// evictionSlack, which the token argument in doc.go relies on.
	clockMaxRTT = 50 * time.Millisecond
	// clockTimeout bounds one background measurement.
	clockTimeout = 5 * time.Second
	// clockSamplesAtStart is how many measurements New takes, keeping the
	// one with the shortest round trip, the tightest bound.
	clockSamplesAtStart = 3
)

// clockSample is one measurement of Redis's clock: Redis's TIME, and the
// local time halfway through the call that read it. Redis read its clock
// somewhere within the call, so the estimate it gives is off by at most
// half the round trip (plus the drift of the local clock since).
type clockSample struct {
	server time.Time     // Redis's TIME
	local  time.Time     // the local clock, with its monotonic reading, halfway through
	rtt    time.Duration // the call's round trip
}

// at estimates Redis's time when the local clock reads local. It measures
// the time elapsed on the local clock's monotonic reading, so a step of
// the local wall clock changes nothing.
func (c *clockSample) at(local time.Time) time.Time {
	return c.server.Add(local.Sub(c.local))
}

// serverClock is a process's running estimate of Redis's clock.
type serverClock struct {
	local func() time.Time                         // time.Now, or a test's clock
	read  func(context.Context) (time.Time, error) // Redis's TIME, or a test's fake

	sample     atomic.Pointer[clockSample]
	last       atomic.Int64 // the last µs handed out, so that they increase
	refreshing atomic.Bool

	mu      sync.Mutex // guards closed and adding to wg
	closed  bool
	wg      sync.WaitGroup
	stopCtx context.Context
	stop    context.CancelFunc
}

func newServerClock(local func() time.Time, read func(context.Context) (time.Time, error)) *serverClock {
	ctx, cancel := context.WithCancel(context.Background())
	return &serverClock{local: local, read: read, stopCtx: ctx, stop: cancel}
}

// measure reads Redis's clock once and returns the sample.
func (c *serverClock) measure(ctx context.Context) (*clockSample, error) {
	t0 := c.local()
	srv, err := c.read(ctx)
	t1 := c.local()
	if err != nil {
		return nil, err
	}
	rtt := t1.Sub(t0)
	return &clockSample{server: srv, local: t0.Add(rtt / 2), rtt: rtt}, nil
}

// start takes clockSamplesAtStart measurements and keeps the best.
func (c *serverClock) start(ctx context.Context) error {
	var best *clockSample
	for range clockSamplesAtStart {
		s, err := c.measure(ctx)
		if err != nil {
			return err
		}
		if best == nil || s.rtt < best.rtt {
			best = s
		}
	}
	c.sample.Store(best)
	return nil
}

// now returns the estimate of Redis's time in µs, greater than any this
// process returned before, and false when there is no estimate good enough
// to use (the caller then lets a script read TIME). It starts a refresh in
// the background when the estimate is due for one.
func (c *serverClock) now() (int64, bool) {
	s := c.sample.Load()
	local := c.local()
	age := local.Sub(s.local)
	if age >= clockRefresh || s.rtt > clockMaxRTT {
		c.refresh()
	}
	if age > clockMaxAge || age < -clockMaxAge || s.rtt > clockMaxRTT {
		return 0, false
	}
	us := s.at(local).UnixMicro()
	// Increasing within the process: a new sample may put the estimate a
	// little behind the last one, and a key this process claimed, deleted
	// by hand and claims again must still get a greater token.
	for {
		last := c.last.Load()
		next := max(us, last+1)
		if c.last.CompareAndSwap(last, next) {
			return next, true
		}
	}
}

// bound is how far off the current estimate may be: half the round trip
// of the call that measured it, rounded up to the microsecond TIME gives.
func (c *serverClock) bound() time.Duration {
	return c.sample.Load().rtt/2 + time.Microsecond
}

// refresh measures again in the background, unless a refresh is already
// running or the clock was closed.
func (c *serverClock) refresh() {
	if !c.refreshing.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.refreshing.Store(false)
		return
	}
	c.wg.Go(func() {
		defer c.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(c.stopCtx, clockTimeout)
		defer cancel()
		// A failed measurement keeps the old sample, which ages out of use
		// after clockMaxAge; the next claim tries again.
		s, err := c.measure(ctx)
		if err != nil {
			return
		}
		// A slow measurement (a loaded Redis or client) does not replace
		// a usable one: it would make the estimate worse, or unusable.
		if old := c.sample.Load(); s.rtt > clockMaxRTT && old.rtt <= clockMaxRTT && c.local().Sub(old.local) <= clockMaxAge {
			return
		}
		c.sample.Store(s)
	})
}

// close stops any refresh and waits for it.
func (c *serverClock) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.stop()
	c.wg.Wait()
}
