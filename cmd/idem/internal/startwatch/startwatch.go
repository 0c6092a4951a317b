package startwatch

import (
	"fmt"
	"time"
)

const (
	// MinWork is the share of a bound's length (1/MinWork) a start must
	// use in CPU time within each bound.
	MinWork = 100 // 1 %
	// MaxBounds caps a start that keeps working.
	MaxBounds = 10
	// Polls is how many times within a bound a watcher should call
	// [Watch.Check] ([Watch.Every]).
	Polls = 30
)

// Watch follows one process's start.
type Watch struct {
	pid     int
	bound   time.Duration
	started time.Time
	mark    time.Time     // when it last did the work of a bound
	cpu     time.Duration // its CPU time then
	read    bool          // its CPU time can be read
}

// New starts watching the start of process pid at now, bounded by bound
// while it does no work.
func New(pid int, bound time.Duration, now time.Time) *Watch {
	w := &Watch{pid: pid, bound: bound, started: now, mark: now}
	w.cpu, w.read = CPUTime(pid)
	return w
}

// Every is how often to call Check: Polls times a bound.
func (w *Watch) Every() time.Duration { return w.bound / Polls }

// Check reads the process's progress at now and returns why its start has
// failed, to follow "did not start" or "did not say it was ready", or ""
// while it may go on.
func (w *Watch) Check(now time.Time) string {
	if !w.read {
		if now.Sub(w.started) >= w.bound {
			return fmt.Sprintf("within %s", w.bound)
		}
		return ""
	}
	if cpu, ok := CPUTime(w.pid); ok && cpu-w.cpu >= w.bound/MinWork {
		w.mark, w.cpu = now, cpu
	}
	switch {
	case now.Sub(w.mark) >= w.bound:
		return fmt.Sprintf("and did no work (under %s of CPU time) for %s, %s after it was started", w.bound/MinWork, w.bound, now.Sub(w.started).Round(time.Millisecond))
	case now.Sub(w.started) >= MaxBounds*w.bound:
		return fmt.Sprintf("within %s, though it kept working", MaxBounds*w.bound)
	}
	return ""
}
