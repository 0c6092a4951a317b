// Package leakcheck fails a test binary whose tests leave goroutines
// running.
//
// It is the root module's own, because that module requires nothing outside
// the standard library, not even for its tests; the other modules use
// go.uber.org/goleak for the same check.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Main runs m's tests and then, if they passed, waits up to 10 seconds for
// the goroutines they started to end. Goroutines still running then are
// printed with their stacks and the binary exits 1. Use it as TestMain:
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
func Main(m interface{ Run() int }) {
	code := m.Run()
	if code == 0 {
		if leaked := wait(10 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running after the tests:\n\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// wait polls the goroutines until only the caller's and the runtime's and
// testing package's own remain, returning the stacks of the others if they
// are still there when limit has passed.
func wait(limit time.Duration) string {
	deadline := time.Now().Add(limit)
	for step := time.Millisecond; ; step = min(2*step, 50*time.Millisecond) {
		leaked := others()
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(step)
	}
}

// background names functions of goroutines that the standard library and
// the testing package run for the whole life of a test binary.
var background = []string{
	"testing.RunTests",
	"testing.(*T).Run(",
	"testing.(*M).",
	"testing.runFuzzTests",
	"testing.runFuzzing",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime.ReadTrace",
}

// others returns the stack of every goroutine but the calling one and the
// background ones.
func others() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	blocks := bytes.Split(buf, []byte("\n\n"))
	var leaked []string
	for _, b := range blocks[1:] { // the first is the calling goroutine
		s := string(bytes.TrimSpace(b))
		if s == "" || isBackground(s) {
			continue
		}
		leaked = append(leaked, s)
	}
	return leaked
}

func isBackground(stack string) bool {
	for _, fn := range background {
		if strings.Contains(stack, fn) {
			return true
		}
	}
	return false
}
