package idemredis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// fakeTime is a Redis TIME for serverClock: it answers offset past the
// local clock, and takes rtt of the local clock to do so (half before Redis
// reads its clock, half after). Each call is reported on calls.
type fakeTime struct {
	local *idemmem.Clock
	mu    sync.Mutex
	off   time.Duration
	rtt   time.Duration
	err   error
	calls chan struct{}
}

func (f *fakeTime) read(ctx context.Context) (time.Time, error) {
	f.mu.Lock()
	off, rtt, err := f.off, f.rtt, f.err
	f.mu.Unlock()
	defer func() { f.calls <- struct{}{} }()
	if err != nil {
		return time.Time{}, err
	}
	f.local.Advance(rtt / 2)
	srv := f.local.Now().Add(off)
	f.local.Advance(rtt - rtt/2)
	return srv, nil
}

func (f *fakeTime) set(off, rtt time.Duration, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.off, f.rtt, f.err = off, rtt, err
}

// waitCall waits for one call of the fake TIME, failing after a deadline.
func (f *fakeTime) waitCall(t *testing.T) {
	t.Helper()
	select {
	case <-f.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no TIME call within 5s")
	}
}

func newFakeClock(t *testing.T, off, rtt time.Duration) (*serverClock, *fakeTime, *idemmem.Clock) {
	t.Helper()
	local := idemmem.NewClock(idemtest.Start)
	f := &fakeTime{local: local, off: off, rtt: rtt, calls: make(chan struct{}, 16)}
	c := newServerClock(local.Now, f.read)
	t.Cleanup(c.close)
	if err := c.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range clockSamplesAtStart {
		f.waitCall(t)
	}
	return c, f, local
}

// The estimate is Redis's TIME plus the local time elapsed since halfway
// through the call, and its bound half that call's round trip.
func TestServerClockEstimate(t *testing.T) {
	t.Parallel()
	const off, rtt = 3*time.Hour + 250*time.Millisecond, 800 * time.Microsecond
	c, _, local := newFakeClock(t, off, rtt)
	// Halfway through the last call, Redis read local+off; the call ended
	// rtt/2 later, so "now" is already rtt/2 past the sample.
	want := local.Now().Add(off).UnixMicro()
	if got, ok := c.now(); !ok || got != want {
		t.Fatalf("now() = %d, %v; want %d (TIME + elapsed)", got, ok, want)
	}
	if b := c.bound(); b != rtt/2+time.Microsecond {
		t.Errorf("bound() = %v, want %v", b, rtt/2+time.Microsecond)
	}
	local.Advance(300 * time.Millisecond)
	if got, ok := c.now(); !ok || got != want+300_000 {
		t.Errorf("now() 300ms later = %d, %v; want %d", got, ok, want+300_000)
	}
	// The clock standing still, each call still gets a greater time.
	a, _ := c.now()
	b, _ := c.now()
	if b <= a {
		t.Errorf("two calls at one instant gave %d then %d, want increasing", a, b)
	}
}

// An estimate older than a second is refreshed in the background by the
// next call; one older than clockMaxAge is not used until a refresh
// succeeds; a slow measurement is not used, nor replaces a usable one.
func TestServerClockRefresh(t *testing.T) {
	t.Parallel()
	c, f, local := newFakeClock(t, time.Minute, time.Millisecond)

	// Due for a refresh: the call still answers from the old sample, and
	// starts a measurement, which moves the estimate to the new offset.
	local.Advance(clockRefresh)
	f.set(2*time.Minute, time.Millisecond, nil)
	if _, ok := c.now(); !ok {
		t.Fatal("now() refused an estimate due for a refresh but not too old")
	}
	f.waitCall(t)
	waitFor(t, func() bool { return !c.refreshing.Load() })
	got, _ := c.now()
	if want := local.Now().Add(2 * time.Minute).UnixMicro(); got < want-1000 || got > want+1000 {
		t.Errorf("now() after the refresh = %d, want about %d", got, want)
	}

	// Redis stops answering: the estimate ages out of use.
	f.set(2*time.Minute, time.Millisecond, errors.New("down"))
	local.Advance(clockMaxAge + time.Millisecond)
	if _, ok := c.now(); ok {
		t.Error("now() used an estimate older than clockMaxAge")
	}
	f.waitCall(t)
	waitFor(t, func() bool { return !c.refreshing.Load() })

	// Redis is back but slow: its measurement is refused.
	f.set(2*time.Minute, clockMaxRTT+time.Millisecond, nil)
	if _, ok := c.now(); ok {
		t.Error("now() used an estimate older than clockMaxAge")
	}
	f.waitCall(t)
	waitFor(t, func() bool { return !c.refreshing.Load() })
	if _, ok := c.now(); ok {
		t.Error("now() used an estimate whose round trip exceeded clockMaxRTT")
	}
	f.waitCall(t) // that call asked for a better one
	waitFor(t, func() bool { return !c.refreshing.Load() })

	// Fast again: usable. A slow measurement then leaves it in place.
	f.set(2*time.Minute, time.Millisecond, nil)
	c.now()
	f.waitCall(t)
	waitFor(t, func() bool { return !c.refreshing.Load() })
	if _, ok := c.now(); !ok {
		t.Fatal("now() refused a fresh, fast estimate")
	}
	local.Advance(clockRefresh)
	f.set(3*time.Minute, clockMaxRTT+time.Millisecond, nil)
	c.now()
	f.waitCall(t)
	waitFor(t, func() bool { return !c.refreshing.Load() })
	// This now() is due for a refresh too, whose measurement moves the
	// fake local clock on by its round trip, perhaps before the line after
	// it reads the clock: the estimate must lie between the two readings.
	before := local.Now()
	got, ok := c.now()
	after := local.Now()
	lo, hi := before.Add(2*time.Minute).UnixMicro(), after.Add(2*time.Minute).UnixMicro()
	if !ok || got < lo-1000 || got > hi+1000 {
		t.Errorf("now() after a slow measurement = %d, %v; want the earlier estimate, between %d and %d", got, ok, lo, hi)
	}
}

// After close, no refresh starts.
func TestServerClockClose(t *testing.T) {
	t.Parallel()
	c, _, local := newFakeClock(t, 0, time.Millisecond)
	c.close()
	local.Advance(clockRefresh)
	c.now()
	if c.refreshing.Load() {
		t.Error("a refresh started after close")
	}
}

// waitFor polls cond until it holds, failing after a deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
}
