package idemhttp_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/httpcheck"
	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// The helpers of the middleware's tests, shared with idemtest's
// (internal/httpcheck).
type (
	result       = httpcheck.Result
	lockedWriter = httpcheck.LockedWriter
	recording    = httpcheck.Recording
	phaseKey     = httpcheck.PhaseKey
)

var (
	do            = httpcheck.Do
	problemType   = httpcheck.ProblemType
	newMiddleware = httpcheck.NewMiddleware
	counter       = httpcheck.Counter
)

func TestTwoKeyHeadersRejected(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)}).Handler(counter(&n))
	req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
	req.Header.Add(idemhttp.HeaderKey, "a")
	req.Header.Add(idemhttp.HeaderKey, "b")
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != 400 || n.Load() != 0 {
		t.Fatalf("status %d, executions %d", rr.Code, n.Load())
	}
}

func TestPassThrough(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Optional: true}).Handler(counter(&n))
	for i := 0; i < 2; i++ {
		if r := do(t, h, "GET", "/x", "", ""); r.Status != 201 { // GET is not protected
			t.Fatalf("GET status %d", r.Status)
		}
		if r := do(t, h, "POST", "/x", "", "{}"); r.Status != 201 || r.Header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("optional POST without key: %d %v", r.Status, r.Header)
		}
	}
	if n.Load() != 4 {
		t.Fatalf("executions %d, want 4", n.Load())
	}
}

func TestConfiguredReplayHeaders(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), ReplayHeaders: []string{"x-private"}}).Handler(counter(&n))
	do(t, h, "POST", "/pay", "k", "{}")
	r := do(t, h, "POST", "/pay", "k", "{}")
	if r.Header.Get("X-Private") != "no" {
		t.Fatalf("configured header not replayed: %v", r.Header)
	}
	for _, bad := range []string{"set-cookie", "Authorization", "WWW-Authenticate"} {
		if _, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), ReplayHeaders: []string{bad}}); err == nil {
			t.Errorf("ReplayHeaders %q accepted; want an error", bad)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*idemhttp.Config{
		"nil":             nil,
		"no store":        {},
		"no scope":        {Store: idemmem.NewStore(nil)},
		"negative ttl":    {SharedScope: true, Store: idemmem.NewStore(nil), TTL: -time.Second},
		"ttl below lease": {SharedScope: true, Store: idemmem.NewStore(nil), TTL: time.Second, Lease: time.Minute},
		"negative body":   {SharedScope: true, Store: idemmem.NewStore(nil), MaxBodyBytes: -1},
	} {
		if _, err := idemhttp.New(cfg); err == nil {
			t.Errorf("%s: New succeeded; want an error", name)
		}
	}
}

func TestKeyFromContext(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	h := newMiddleware(t, idemhttp.Config{Store: idemmem.NewStore(nil), Scope: func(*http.Request) (idem.Scope, error) { return "t1", nil }}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s, k, ok := idemhttp.KeyFromContext(r.Context())
			got.Store(fmt.Sprint(s, "/", k, "/", ok))
		}))
	do(t, h, "POST", "/", "abc", "{}")
	if got.Load() != "t1/abc/true" {
		t.Fatalf("KeyFromContext = %v", got.Load())
	}
}

func TestProblemJSON(t *testing.T) {
	t.Parallel()
	rr := httptest.NewRecorder()
	(&idemhttp.Problem{Type: "urn:x", Title: "T", Status: 402, Detail: "d", RetryAfter: 3,
		Extra: map[string]any{"balance": 5, "status": "ignored", "account": "a"}}).Write(rr)
	want := `{"type":"urn:x","title":"T","status":402,"detail":"d","account":"a","balance":5}` + "\n"
	if rr.Body.String() != want || rr.Code != 402 || rr.Header().Get("Retry-After") != "3" ||
		rr.Header().Get("Content-Type") != idemhttp.ProblemContentType {
		t.Fatalf("got %d %v %s", rr.Code, rr.Header(), rr.Body.String())
	}
	rr = httptest.NewRecorder()
	(&idemhttp.Problem{Title: "T", Status: 500, Extra: map[string]any{"bad": func() {}}}).Write(rr)
	if rr.Body.String() != `{"type":"about:blank","title":"T","status":500}`+"\n" {
		t.Fatalf("unmarshalable extension: %s", rr.Body.String())
	}
}

// Configuration errors are *idem.ArgumentError, as every constructor's in
// the toolkit, naming the field.
func TestConfigErrorsAreArgumentErrors(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	for _, cfg := range []idemhttp.Config{
		{},
		{SharedScope: true, Store: store, TTL: -time.Second},
		{Store: store},
		{Store: store, TTL: time.Second, Lease: time.Minute},
		{Store: store, ReplayHeaders: []string{"Set-Cookie"}},
	} {
		var ae *idem.ArgumentError
		if _, err := idemhttp.New(&cfg); !errors.As(err, &ae) || !errors.Is(err, idem.ErrInvalidArgument) || !strings.HasPrefix(ae.Field, "idemhttp.Config.") {
			t.Errorf("New(%+v) = %v, want an *idem.ArgumentError naming the field", cfg, err)
		}
	}
	if _, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: store, TTL: 4 * time.Second}); err != nil {
		t.Errorf("a TTL shorter than the default lease, lease unset: %v; want the lease lowered to it", err)
	}
}

// An informational status (1xx: 100 Continue, 103 Early Hints) a handler
// writes before its answer is not the answer: the client gets the final
// status and body, and a duplicate gets them replayed, the handler run once.
func TestInformationalStatusIsNotTheAnswer(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusContinue)
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":1}`)
	}))
	for i, want := range []string{"", "true"} {
		r := do(t, h, "POST", "/pay", "k", "{}")
		if r.Status != http.StatusCreated || r.Body != `{"id":1}` || r.Header.Get(idemhttp.HeaderReplayed) != want {
			t.Errorf("request %d: %d %q, replayed %q; want 201 {\"id\":1}, replayed %q", i+1, r.Status, r.Body, r.Header.Get(idemhttp.HeaderReplayed), want)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times; want once", n)
	}
}

// The first final status a handler writes is its answer, as net/http
// has it: a later WriteHeader is superfluous, even one written before any
// of the body, and changes neither what the client gets nor what is kept.
func TestFirstFinalStatusIsTheAnswer(t *testing.T) {
	t.Parallel()
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, "ok")
	}))
	for i, want := range []string{"", "true"} {
		r := do(t, h, "POST", "/pay", "k", "{}")
		if r.Status != http.StatusOK || r.Body != "ok" || r.Header.Get(idemhttp.HeaderReplayed) != want {
			t.Errorf("request %d: %d %q, replayed %q; want 200 ok, replayed %q", i+1, r.Status, r.Body, r.Header.Get(idemhttp.HeaderReplayed), want)
		}
	}
}

// An answer of exactly MaxResponseBytes is within the bound: kept whole and
// replayed to a duplicate, the handler run once.
func TestAnswerOfExactlyMaxResponseBytesIsKept(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), MaxResponseBytes: 8}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "1234")
		fmt.Fprint(w, "5678")
	}))
	for i, want := range []string{"", "true"} {
		r := do(t, h, "POST", "/pay", "k", "{}")
		if r.Status != http.StatusCreated || r.Body != "12345678" || r.Header.Get(idemhttp.HeaderReplayed) != want {
			t.Errorf("request %d: %d %q, replayed %q; want 201 12345678, replayed %q", i+1, r.Status, r.Body, r.Header.Get(idemhttp.HeaderReplayed), want)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times; want once", n)
	}
}

// An answer past MaxResponseBytes, on a store outside the handler's
// transaction (the effect has happened), reaches the client whole, but its
// body is not kept: the record says it was omitted and holds no body.
func TestAnswerPastMaxResponseBytesIsSentNotKept(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	h := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, MaxResponseBytes: 8}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "12345")
		fmt.Fprint(w, "6789")
	}))
	if r := do(t, h, "POST", "/pay", "k", "{}"); r.Status != http.StatusCreated || r.Body != "123456789" {
		t.Fatalf("the client got %d %q; want 201 and the whole body", r.Status, r.Body)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateCompleted || !rec.Response.BodyOmitted || len(rec.Response.Body) != 0 {
		t.Fatalf("the record: %+v, %v; want it completed with its body omitted", rec, err)
	}
}
