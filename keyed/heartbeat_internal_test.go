package keyed

import (
	"strings"
	"testing"
	"time"
)

// A lease the store decides by the engine's own clock is kept as a
// wall-clock end, and other claims judge it by the wall clock: the
// heartbeat counts its age on the wall clock too, so that a step of the
// wall clock during the execution ends the lease for both at once rather
// than for the store alone. A lease of a store on a clock of its own counts
// from the sending, on the monotonic clock, which no step moves.
func TestLeaseOnTheEnginesClockCountsOnTheWallClock(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	hb := &heartbeat{e: &Engine{cfg: Config{Lease: lease}}}
	sent := time.Now() // with a monotonic reading, as the system clock gives
	answered := sent.Add(2 * time.Second)
	monotonic := func(t time.Time) bool { return strings.Contains(t.String(), " m=") }
	if !monotonic(sent) {
		t.Skip("skipping: this platform's clock gives no monotonic reading")
	}

	hb.sameClock = true
	for _, c := range []struct {
		name string
		end  time.Time
		want time.Time
	}{
		{"a lease begun before its answer", sent.Add(time.Second + lease), sent.Add(time.Second)},
		{"an end past the answer's time plus the lease", answered.Add(2 * lease), answered},
		{"no end said", time.Time{}, sent},
	} {
		got := hb.began(sent, answered, c.end)
		if monotonic(got) || !got.Equal(c.want) {
			t.Errorf("%s: the lease counted from %v; want %v, on the wall clock alone (no monotonic reading)", c.name, got, c.want.Round(0))
		}
	}

	hb.sameClock = false
	if got := hb.began(sent, answered, sent.Add(lease)); got != sent {
		t.Errorf("a store on a clock of its own: the lease counted from %v; want its sending, %v, monotonic reading and all", got, sent)
	}
}
