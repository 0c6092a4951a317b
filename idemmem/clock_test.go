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
