package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQuitKeepsEveryStackLine: the goroutines' stacks a replica prints when
// quit asks for them (a start that failed) are all in what quit returns,
// however many lines they take: a running `idem serve` prints over 400, and
// the last logTailLines of them alone would leave out their beginning, the
// SIGQUIT line and goroutine 1, the one that names what a start waits for.
func TestQuitKeepsEveryStackLine(t *testing.T) {
	hc := &http.Client{Transport: newHTTPTransport(), Timeout: 30 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	db := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	r := launch(t, "quit", "serve", "--addr", "127.0.0.1:0", "--db", db, "--api-keys", "tenant_"+randHex(4)+":sk_e2e_"+randHex(16)).ready(t, hc)
	out := r.quit()
	for _, want := range []string{"SIGQUIT: quit", "\ngoroutine 1 "} {
		if !strings.Contains(out, want) {
			t.Errorf("what quit returned (%d lines) lacks %q; its first lines:\n%s", strings.Count(out, "\n")+1, want, strings.Join(strings.SplitN(out, "\n", 10)[:9], "\n"))
		}
	}
	if n := strings.Count(out, "\n") + 1; !t.Failed() && n <= logTailLines {
		t.Fatalf("the replica wrote %d lines with its stacks, no more than the %d-line tail keeps: this test needs more to mean anything", n, logTailLines)
	}
}
