package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func TestOthersSeesALeakedGoroutineUntilItEnds(t *testing.T) {
	stop := make(chan struct{})
	started := make(chan struct{})
	go func() {
		close(started)
		<-stop
	}()
	<-started
	if leaked := wait(20 * time.Millisecond); !strings.Contains(leaked, "leakcheck.TestOthersSeesALeakedGoroutineUntilItEnds") {
		t.Fatalf("a goroutine the test left running was not reported; got:\n%s", leaked)
	}
	close(stop)
	if leaked := wait(5 * time.Second); strings.Contains(leaked, "leakcheck.TestOthersSeesALeakedGoroutineUntilItEnds") {
		t.Fatalf("a goroutine that ended is still reported:\n%s", leaked)
	}
}
