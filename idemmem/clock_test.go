package idemmem_test

import (
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemmem"
)

func TestClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := idemmem.NewClock(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now moved on its own: %v", got)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), start.Add(90*time.Second); !got.Equal(want) {
		t.Errorf("after Advance, Now = %v, want %v", got, want)
	}
	c.Advance(-30 * time.Second)
	if got, want := c.Now(), start.Add(time.Minute); !got.Equal(want) {
		t.Errorf("after a negative Advance, Now = %v, want %v", got, want)
	}
	later := start.Add(24 * time.Hour)
	c.Set(later)
	if got := c.Now(); !got.Equal(later) {
		t.Errorf("after Set, Now = %v, want %v", got, later)
	}
}

func TestClockConcurrentUse(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := idemmem.NewClock(start)
	const goroutines, steps = 8, 100
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range steps {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(goroutines*steps*time.Millisecond); !got.Equal(want) {
		t.Errorf("Now = %v, want %v: an Advance was lost", got, want)
	}
}

func TestClockAfterFunc(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := idemmem.NewClock(start)
	fired := make(chan string, 8)
	c.AfterFunc(2*time.Second, func() { fired <- "2s" })
	c.AfterFunc(time.Second, func() { fired <- "1s" })
	stop3 := c.AfterFunc(3*time.Second, func() { fired <- "3s" })
	c.AfterFunc(10*time.Second, func() { fired <- "10s" })

	c.Advance(999 * time.Millisecond)
	c.Advance(0)
	select {
	case got := <-fired:
		t.Fatalf("timer %s fired before its time", got)
	default:
	}

	c.Advance(time.Millisecond) // 1s: exactly due
	if got := receive(t, fired); got != "1s" {
		t.Errorf("at 1s fired %s, want 1s", got)
	}
	if !stop3() {
		t.Errorf("stop of a pending timer = false, want true")
	}
	if stop3() {
		t.Errorf("second stop = true, want false")
	}
	c.Set(start.Add(5 * time.Second))
	if got := receive(t, fired); got != "2s" {
		t.Errorf("at 5s fired %s, want 2s", got)
	}
	select {
	case got := <-fired:
		t.Fatalf("timer %s fired after its stop, or before its time", got)
	default:
	}

	// Once fired, a timer's stop prevents nothing.
	stop := c.AfterFunc(time.Second, func() { fired <- "again" })
	c.Advance(time.Hour)
	got := []string{receive(t, fired), receive(t, fired)}
	if !(got[0] == "10s" && got[1] == "again" || got[0] == "again" && got[1] == "10s") {
		t.Errorf("after an hour fired %q, want 10s and again", got)
	}
	if stop() {
		t.Errorf("stop of a fired timer = true, want false")
	}

	// A timer for no time at all runs at once.
	c.AfterFunc(0, func() { fired <- "now" })
	if got := receive(t, fired); got != "now" {
		t.Errorf("AfterFunc(0) fired %s, want now", got)
	}
}

// receive waits for a fired timer's name: timers run in goroutines of
// their own.
func receive(t *testing.T, fired <-chan string) string {
	t.Helper()
	select {
	case got := <-fired:
		return got
	case <-time.After(10 * time.Second):
		t.Fatalf("no timer fired within 10s")
		return ""
	}
}
