// Package httpcheck is what the middleware's tests send and read, in both
// places they live: idemhttp's own tests (in this module, which may import
// nothing outside it) and idemtest.TestMiddleware's cases (in the idemtest
// module). A request under a key, its answer, the problem type of a
// refusal, a handler that counts its runs, and an Observer that writes down
// the phases it sees.
package httpcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// Result is an answer as the client got it.
type Result struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends h a request with a JSON Content-Type, the key (none when
// empty), the body (none when empty) and the headers hdr names in pairs
// (name, value, …), and returns the answer.
func Do(t testing.TB, h http.Handler, method, target, key, body string, hdr ...string) Result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return Result{rr.Code, rr.Result().Header, rr.Body.String()}
}

// ProblemType returns the type of the problem r carries, failing the test
// when r is not a well-formed application/problem+json answer whose status
// is r's.
func ProblemType(t testing.TB, r Result) string {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != idemhttp.ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q (body %s)", ct, idemhttp.ProblemContentType, r.Body)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Title  string `json:"title"`
	}
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.Body, err)
	}
	if p.Status != r.Status || p.Title == "" {
		t.Fatalf("problem %+v does not match status %d", p, r.Status)
	}
	return p.Type
}

// NewMiddleware is idemhttp.New(&cfg), failing the test on an error.
func NewMiddleware(t testing.TB, cfg idemhttp.Config) *idemhttp.Middleware {
	t.Helper()
	m, err := idemhttp.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Counter is a handler that counts executions and answers 201 with its
// execution number, a cookie and a custom header.
func Counter(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/things/%d", i))
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Private", "no")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"execution":%d}`, i)
	})
}

// LockedWriter writes to W under Mu, so that a test can read what a logger
// wrote while requests still run.
type LockedWriter struct {
	W  io.Writer
	Mu *sync.Mutex
}

func (l LockedWriter) Write(p []byte) (int, error) {
	l.Mu.Lock()
	defer l.Mu.Unlock()
	return l.W.Write(p)
}

// Recording is an idemhttp.Observer that writes down what it sees: each
// phase begun ("+claim") and ended ("-claim"), a phase ended that was
// never begun ("!…"), the events phases end with, and the store's round
// trips. The context Begin returns carries PhaseKey.
type Recording struct {
	mu     sync.Mutex
	log    []string
	open   map[int]idemhttp.Phase
	next   int
	ends   []idemhttp.Event
	stores []idemhttp.StoreOp
}

// PhaseKey keys, in the contexts Recording.Begin returns, the number of
// the phase begun.
type PhaseKey struct{}

func (r *Recording) Begin(ctx context.Context, e idemhttp.Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.open == nil {
		r.open = map[int]idemhttp.Phase{}
	}
	r.next++
	r.open[r.next] = e.Phase
	r.log = append(r.log, "+"+e.Phase.String())
	return context.WithValue(ctx, PhaseKey{}, r.next)
}

func (r *Recording) End(ctx context.Context, e idemhttp.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, _ := ctx.Value(PhaseKey{}).(int)
	if p, ok := r.open[id]; !ok || p != e.Phase {
		r.log = append(r.log, "!end of a phase not begun: "+e.Phase.String())
	}
	delete(r.open, id)
	r.log = append(r.log, "-"+e.Phase.String())
	r.ends = append(r.ends, e)
}

func (r *Recording) Store(_ context.Context, op idemhttp.StoreOp, _ time.Duration, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stores = append(r.stores, op)
}

// Take returns what was seen since the last Take.
func (r *Recording) Take() (log []string, ends []idemhttp.Event, stores []idemhttp.StoreOp) {
	r.mu.Lock()
	defer r.mu.Unlock()
	log, ends, stores = r.log, r.ends, r.stores
	r.log, r.ends, r.stores = nil, nil, nil
	return log, ends, stores
}

// Ended returns the event the phase p ended with, among ends.
func Ended(ends []idemhttp.Event, p idemhttp.Phase) (idemhttp.Event, bool) {
	for _, e := range ends {
		if e.Phase == p {
			return e, true
		}
	}
	return idemhttp.Event{}, false
}
