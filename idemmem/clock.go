package idemmem

import (
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Clock is a manual idem.Clock, for tests: time stands still until the test
// moves it with Advance or Set, so leases and TTLs expire exactly when the
// test says and never because a machine was slow. It is safe for concurrent
// use.
//
// It is also idem.Timers on its own time: a timer set with AfterFunc fires
// when Advance or Set moves the clock to or past it, and never because real
// time passed. Pass the clock as both Clock and Timers (a consumer's
// retries and heartbeats, a relay's polls), and a test drives them by
// moving it.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers map[uint64]*clockTimer
}

var (
	_ idem.Clock  = (*Clock)(nil)
	_ idem.Timers = (*Clock)(nil)
)

// clockTimer is one pending AfterFunc.
type clockTimer struct {
	at time.Time
	f  func()
}

// NewClock returns a Clock that reads t until it is moved.
func NewClock(t time.Time) *Clock {
	return &Clock{now: t}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward if d is negative), then
// fires the timers that are due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	due := c.dueLocked()
	c.mu.Unlock()
	fire(due)
}

// Set moves the clock to t, then fires the timers that are due.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	due := c.dueLocked()
	c.mu.Unlock()
	fire(due)
}

// AfterFunc implements idem.Timers: f runs, in a goroutine of its own as
// with time.AfterFunc, once the clock has been moved to now+d or past it
// (at once when d <= 0), unless stop is called first; stop reports whether
// it prevented the call. Each timer runs in a goroutine of its own, so the
// timers one move makes due run in no particular order.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	if d <= 0 {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	if c.timers == nil {
		c.timers = make(map[uint64]*clockTimer)
	}
	c.seq++
	id := c.seq
	c.timers[id] = &clockTimer{at: c.now.Add(d), f: f}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, pending := c.timers[id]
		delete(c.timers, id)
		return pending
	}
}

// dueLocked takes the timers due at c.now out of c.timers. c.mu is held.
func (c *Clock) dueLocked() []*clockTimer {
	var due []*clockTimer
	for id, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
			delete(c.timers, id)
		}
	}
	return due
}

func fire(due []*clockTimer) {
	for _, t := range due {
		go t.f()
	}
}
