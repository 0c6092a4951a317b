package idemtest_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"
)

func TestEventually(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	idemtest.Eventually(t, 10*time.Second, "the third look", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("cond called %d times, want 3", n.Load())
	}

	failed := make(chan bool, 1)
	go func() {
		ft := &fatalRecorder{TB: t}
		defer func() { failed <- ft.failed }()
		defer func() { recover() }()
		idemtest.Eventually(ft, 5*time.Millisecond, "never", func() bool { return false })
	}()
	if !<-failed {
		t.Fatal("Eventually did not fail on a condition that never holds")
	}
}

// fatalRecorder records Fatalf instead of ending the test, by panicking out
// of the helper like runtime.Goexit would.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	panic("fatal")
}
