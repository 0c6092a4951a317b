package idemhttp_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// bodyUnreadableDetail is the whole detail a client gets for a body that
// did not arrive.
const bodyUnreadableDetail = "The request body could not be read completely; send it again with the same Idempotency-Key."

// problemDetail returns the detail member of a problem body.
func problemDetail(t *testing.T, body string) string {
	t.Helper()
	var p struct {
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("problem body %q: %v", body, err)
	}
	return p.Detail
}

// assertRevealsNone fails when the answer (headers and body) contains any of
// the fragments.
func assertRevealsNone(t *testing.T, header http.Header, body string, fragments ...string) {
	t.Helper()
	var all bytes.Buffer
	header.Write(&all)
	all.WriteString(body)
	for _, f := range fragments {
		if strings.Contains(all.String(), f) {
			t.Errorf("the answer reveals %q:\n%s", f, all.String())
		}
	}
}

// TestStalledBodyOverTCPRevealsNoAddress: a client that announces a body
// and stops sending it gets a 400 that names no socket address; the real
// error goes to the middleware's logger.
func TestStalledBodyOverTCPRevealsNoAddress(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	var n atomic.Int64
	m := newMiddleware(t, idemhttp.Config{SharedScope: true,
		Store:  idemmem.NewStore(nil),
		Logger: slog.New(slog.NewJSONHandler(lockedWriter{W: &logs, Mu: &mu}, nil)),
	})
	srv := httptest.NewUnstartedServer(m.Handler(counter(&n)))
	// Short, so the stalled body times out at once; the headers are sent
	// in one write well inside it.
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A bound on the test, not a wait: the answer comes after ReadTimeout.
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "POST /pay HTTP/1.1\r\nHost: example.test\r\nIdempotency-Key: stalled-1\r\n" +
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", resp.StatusCode, body)
	}
	if got := problemType(t, result{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}); got != idemhttp.ProblemBodyUnreadable {
		t.Errorf("problem type %q, want %q", got, idemhttp.ProblemBodyUnreadable)
	}
	if got := problemDetail(t, string(body)); got != bodyUnreadableDetail {
		t.Errorf("detail %q, want %q", got, bodyUnreadableDetail)
	}
	assertRevealsNone(t, resp.Header, string(body), "127.0.0.1", "tcp", "timeout")
	if n.Load() != 0 {
		t.Errorf("the handler ran %d times for a body that never arrived", n.Load())
	}
	mu.Lock()
	logged := logs.String()
	mu.Unlock()
	if !strings.Contains(logged, "i/o timeout") || !strings.Contains(logged, "127.0.0.1") {
		t.Errorf("the real error was not logged: %s", logged)
	}
}

// opErrReader fails as a connection does, with both ends' addresses in
// its error.
type opErrReader struct{ err *net.OpError }

func (r opErrReader) Read([]byte) (int, error) { return 0, r.err }

func internalOpError() *net.OpError {
	return &net.OpError{
		Op:     "read",
		Net:    "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 8443},
		Addr:   &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 51234},
		Err:    os.ErrDeadlineExceeded,
	}
}

// TestBodyReadErrorRevealsNothing: whatever a failed body read says stays
// in the log.
func TestBodyReadErrorRevealsNothing(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true,
		Store:  idemmem.NewStore(nil),
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	}).Handler(counter(&n))
	opErr := internalOpError()
	req := httptest.NewRequest(http.MethodPost, "/pay", opErrReader{opErr})
	req.Header.Set(idemhttp.HeaderKey, "read-fails-1")
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)

	r := result{Status: rr.Code, Header: rr.Result().Header, Body: rr.Body.String()}
	if r.Status != http.StatusBadRequest || problemType(t, r) != idemhttp.ProblemBodyUnreadable {
		t.Fatalf("answer %+v, want 400 %s", r, idemhttp.ProblemBodyUnreadable)
	}
	if got := problemDetail(t, r.Body); got != bodyUnreadableDetail {
		t.Errorf("detail %q, want %q", got, bodyUnreadableDetail)
	}
	assertRevealsNone(t, r.Header, r.Body, opErr.Error(), "10.9.8.7", "10.1.2.3", "tcp", "deadline")
	if n.Load() != 0 {
		t.Errorf("the handler ran %d times", n.Load())
	}
	if !strings.Contains(logs.String(), "10.1.2.3") {
		t.Errorf("the real error was not logged: %s", logs.String())
	}
}

// TestScopeErrorRevealsNothing: the Scope function's error is the
// application's, not the client's: it is logged, and the client gets a
// fixed detail.
func TestScopeErrorRevealsNothing(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var n atomic.Int64
	opErr := internalOpError()
	h := newMiddleware(t, idemhttp.Config{
		Store:  idemmem.NewStore(nil),
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		Scope: func(*http.Request) (idem.Scope, error) {
			return "", fmt.Errorf("looking up the tenant: %w", opErr)
		},
	}).Handler(counter(&n))
	r := do(t, h, http.MethodPost, "/pay", "scope-fails-1", "{}")
	if r.Status != http.StatusBadRequest || problemType(t, r) != idemhttp.ProblemScope {
		t.Fatalf("answer %+v, want 400 %s", r, idemhttp.ProblemScope)
	}
	if problemDetail(t, r.Body) == "" {
		t.Error("the problem has no detail")
	}
	assertRevealsNone(t, r.Header, r.Body, "looking up the tenant", "10.9.8.7", "10.1.2.3", "tcp")
	if n.Load() != 0 {
		t.Errorf("the handler ran %d times", n.Load())
	}
	if !strings.Contains(logs.String(), "looking up the tenant") {
		t.Errorf("the Scope error was not logged: %s", logs.String())
	}
}

// TestRequestLogHidesKey: a logged request carries neither its key nor
// the key's unsalted SHA-256, which a guessed key could be checked
// against.
func TestRequestLogHidesKey(t *testing.T) {
	t.Parallel()
	const key, scope = "pay-7f3a91", "tenant-7"
	var logs bytes.Buffer
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{
		Store:  idemmem.NewStore(nil),
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Scope:  func(*http.Request) (idem.Scope, error) { return scope, nil },
	}).Handler(counter(&n))
	if r := do(t, h, http.MethodPost, "/pay", key, "{}"); r.Status != http.StatusCreated {
		t.Fatalf("answer %+v", r)
	}
	if r := do(t, h, http.MethodPost, "/pay", key, "{}"); r.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("duplicate not replayed: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per request, got:\n%s", logs.String())
	}
	var unkeyed []string
	for _, s := range []string{key, scope + key} {
		sum := sha256.Sum256([]byte(s))
		unkeyed = append(unkeyed, hex.EncodeToString(sum[:6]), hex.EncodeToString(sum[:8]))
	}
	var digest string
	for _, line := range lines {
		var rec struct {
			Key   string `json:"key"`
			Scope string `json:"scope"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if strings.Contains(line, key) {
			t.Errorf("log line holds the key: %s", line)
		}
		for _, u := range unkeyed {
			if strings.Contains(line, u) {
				t.Errorf("log line holds an unkeyed SHA-256 prefix %s: %s", u, line)
			}
		}
		if rec.Scope != scope || rec.Key == "" {
			t.Errorf("log line lacks the scope or the key's digest: %s", line)
		}
		if digest != "" && rec.Key != digest {
			t.Errorf("one key logged as %q and %q: lines about it cannot be correlated", digest, rec.Key)
		}
		digest = rec.Key
	}
	if want := idem.KeyDigest(scope, key); digest != want {
		t.Errorf("logged key %q, want idem.KeyDigest of the scope and key, %q", digest, want)
	}
}

// TestScopeProblemIsSent: a Scope function that returns a *Problem has
// written it for the client, and it is sent as it is.
func TestScopeProblemIsSent(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{
		Store: idemmem.NewStore(nil),
		Scope: func(r *http.Request) (idem.Scope, error) {
			if r.Header.Get("X-Tenant") == "gone" {
				return "", &idemhttp.Problem{Type: "urn:example:tenant-closed", Title: "Tenant closed", Status: http.StatusForbidden, Detail: "This tenant was closed."}
			}
			return "", fmt.Errorf("authenticating: %w", &idemhttp.Problem{Detail: "Send the X-Tenant header."})
		},
	}).Handler(counter(&n))
	r := do(t, h, http.MethodPost, "/pay", "scope-problem-1", "{}")
	if r.Status != http.StatusBadRequest || problemType(t, r) != idemhttp.ProblemScope || problemDetail(t, r.Body) != "Send the X-Tenant header." {
		t.Errorf("wrapped Problem without status or type: %+v", r)
	}
	r = do(t, h, http.MethodPost, "/pay", "scope-problem-2", "{}", "X-Tenant", "gone")
	if r.Status != http.StatusForbidden || problemType(t, r) != "urn:example:tenant-closed" || problemDetail(t, r.Body) != "This tenant was closed." {
		t.Errorf("whole Problem: %+v", r)
	}
	if n.Load() != 0 {
		t.Errorf("the handler ran %d times", n.Load())
	}
}
