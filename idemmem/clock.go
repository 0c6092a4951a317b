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
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

var _ idem.Clock = (*Clock)(nil)

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

// Advance moves the clock forward by d (backward if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
