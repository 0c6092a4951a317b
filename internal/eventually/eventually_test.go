package eventually

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records a Fatalf and stops the calling goroutine, as testing.T
// does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func run(tb *fatalTB, f func()) (failed bool) {
	defer func() {
		if r := recover(); r != nil {
			if r != tb {
				panic(r)
			}
			failed = true
		}
	}()
	f()
	return false
}

func TestProgressing(t *testing.T) {
	t.Parallel()
	// A slow count that keeps growing passes, however long it takes in
	// all: here five times the stall bound.
	var n atomic.Int64
	start := time.Now()
	tb := &fatalTB{TB: t}
	if run(tb, func() {
		Progressing(tb, 20*time.Millisecond, "a slow count", 50, func() int64 {
			if time.Since(start) > time.Duration(n.Load()+1)*2*time.Millisecond {
				n.Add(1)
			}
			return n.Load()
		})
	}) {
		t.Fatalf("a growing count failed: %s", tb.msg)
	}
	if time.Since(start) < 100*time.Millisecond || n.Load() != 50 {
		t.Errorf("returned after %s at %d", time.Since(start), n.Load())
	}
	// A count that stops short of want fails once the stall bound passes.
	tb = &fatalTB{TB: t}
	if !run(tb, func() {
		Progressing(tb, 20*time.Millisecond, "a stuck count", 10, func() int64 { return 3 })
	}) {
		t.Fatal("a stuck count passed")
	}
	if !strings.HasPrefix(tb.msg, "no progress for") {
		t.Errorf("failed with %q", tb.msg)
	}
}
