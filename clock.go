package idem

import "time"

// Clock tells the time. Stores and middleware take one so that tests move
// time forward instead of sleeping.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Time

// Now calls f.
func (f ClockFunc) Now() time.Time { return f() }

// Timers schedules wake-ups: a consumer's retries and heartbeats, a
// relay's polls and backoff. Tests that drive a manual Clock pass Timers
// driven by the same clock, so that moving the clock fires them.
type Timers interface {
	// AfterFunc calls f, in a goroutine of its own, once d has passed,
	// unless stop is called first. stop reports whether it prevented the
	// call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// RuntimeTimers are the Go runtime's timers (time.AfterFunc).
type RuntimeTimers struct{}

// AfterFunc calls time.AfterFunc.
func (RuntimeTimers) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}
