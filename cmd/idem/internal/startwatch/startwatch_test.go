package startwatch

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// work uses at least d of this process's CPU time.
func work(t *testing.T, d time.Duration) {
	t.Helper()
	from, _ := CPUTime(os.Getpid())
	for n := 0; ; n++ {
		if n%1000 == 0 {
			if now, _ := CPUTime(os.Getpid()); now-from >= d {
				return
			}
		}
	}
}

func needCPUTime(t *testing.T) {
	t.Helper()
	if _, ok := CPUTime(os.Getpid()); !ok {
		t.Skip("skipping: no reading of a process's CPU time here")
	}
}

// A start that waits without working fails at its bound, not before.
func TestStartThatDoesNoWorkFailsAtItsBound(t *testing.T) {
	needCPUTime(t)
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	const bound = 10 * time.Second // 100ms of CPU time: sleep uses none of it
	at := time.Now()
	w := New(cmd.Process.Pid, bound, at)
	if why := w.Check(at.Add(bound - time.Millisecond)); why != "" {
		t.Fatalf("within its bound: %q; want no failure yet", why)
	}
	why := w.Check(at.Add(bound))
	if !strings.Contains(why, "did no work") {
		t.Fatalf("at its bound, a start that did no work: %q; want it failed", why)
	}
}

// A start that keeps working goes on past its bound, and ends at MaxBounds
// bounds.
func TestStartThatKeepsWorkingGoesOnUntilMaxBounds(t *testing.T) {
	needCPUTime(t)
	const bound = time.Second // 10ms of CPU time a bound
	at := time.Now()
	w := New(os.Getpid(), bound, at)
	for i := 1; i < MaxBounds; i++ {
		work(t, 2*bound/MinWork)
		if why := w.Check(at.Add(time.Duration(i) * bound)); why != "" {
			t.Fatalf("after %d bounds, each with its work: %q; want it going on", i, why)
		}
	}
	work(t, 2*bound/MinWork)
	why := w.Check(at.Add(MaxBounds * bound))
	if !strings.Contains(why, "kept working") {
		t.Fatalf("after %d bounds of work: %q; want it ended", MaxBounds, why)
	}
}

// A start that worked, then stopped, fails a bound after its last work.
func TestStartThatStopsWorkingFailsABoundAfter(t *testing.T) {
	needCPUTime(t)
	const bound = time.Second
	at := time.Now()
	w := New(os.Getpid(), bound, at)
	work(t, 2*bound/MinWork)
	if why := w.Check(at.Add(bound / 2)); why != "" {
		t.Fatalf("%q; want it going on", why)
	}
	// No more work: the checks below come microseconds apart in real
	// time, far under a bound's share of CPU time.
	if why := w.Check(at.Add(bound/2 + bound - time.Millisecond)); why != "" {
		t.Fatalf("just within a bound of its last work: %q; want it going on", why)
	}
	if why := w.Check(at.Add(bound/2 + bound)); !strings.Contains(why, "did no work") {
		t.Fatalf("a bound after its last work: %q; want it failed", why)
	}
}

func TestEvery(t *testing.T) {
	if got := New(os.Getpid(), 30*time.Second, time.Now()).Every(); got != time.Second {
		t.Fatalf("Every of a 30s bound = %s; want 1s (%d polls a bound)", got, Polls)
	}
}
