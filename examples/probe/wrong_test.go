package probe_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/idemprobe"
)

// wrongOrders remembers each key's first answer and replays it, but
// compares no body (a key reused for another order gets the first order)
// and replays every header (another client's session cookie included).
type wrongOrders struct {
	mu      sync.Mutex
	created int
	answers map[string]answer
}

type answer struct {
	header http.Header
	body   string
}

func (h *wrongOrders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 || strings.ContainsAny(key, "\t\r\n") {
		http.Error(w, "a valid Idempotency-Key is required", http.StatusBadRequest)
		return
	}
	io.Copy(io.Discard, r.Body)
	// One lock around the whole request: every key runs once, however many
	// arrive at once. That part is right.
	h.mu.Lock()
	defer h.mu.Unlock()
	if a, ok := h.answers[key]; ok {
		for name, vs := range a.header {
			w.Header()[name] = vs
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, a.body)
		return
	}
	h.created++
	a := answer{header: http.Header{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {fmt.Sprintf("session=user-%d-secret", h.created)},
	}, body: fmt.Sprintf(`{"id":"ord_%d"}`, h.created)}
	h.answers[key] = a
	for name, vs := range a.header {
		w.Header()[name] = vs
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, a.body)
}

const childEnv = "IDEM_EXAMPLES_WRONG_HANDLER"

// TestWrongHandler probes wrongOrders, and fails. It runs only in the
// child process TestWrongHandlerFailsItsChecks starts.
func TestWrongHandler(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return
	}
	idemprobe.Test(t, &idemprobe.Config{
		Handler: &wrongOrders{answers: map[string]answer{}},
		URL:     "/orders",
		Body:    `{"item":"book {{n}}"}`,
		Cases:   idemprobe.DraftCases(),
	})
}

func TestWrongHandlerFailsItsChecks(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^TestWrongHandler$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the child did not fail: %v\n%s", err, out)
	}
	t.Logf("the output of go test -v -run TestWrongHandler:\n%s", out)
	var failed []string
	for _, m := range regexp.MustCompile(`--- FAIL: TestWrongHandler/(\S+)`).FindAllStringSubmatch(string(out), -1) {
		failed = append(failed, m[1])
	}
	want := []string{"key-reuse-refused", "draft-payload-mismatch", "draft-corrected-retry", "no-credentials-replayed"}
	if !slices.Equal(failed, want) {
		t.Errorf("failed subtests %v, want %v", failed, want)
	}
	for _, says := range []string{
		"answered 201 Created with the first request's answer: the body was not compared",
		"a replay carries Set-Cookie (session=xxxxx)",
		"other-payload: answered 201 Created, ord_",
	} {
		if !strings.Contains(string(out), says) {
			t.Errorf("the output does not say %q", says)
		}
	}
}
