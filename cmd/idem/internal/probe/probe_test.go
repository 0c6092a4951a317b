package probe_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/cmd/idem/internal/probe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// flaw is the one thing a fake endpoint gets wrong.
type flaw int

const (
	correct           flaw = iota
	noAtomicClaim          // checks for a completed key, then runs: duplicates in flight run too
	noMismatchCheck        // replays the first answer whatever the body
	replaysCookies         // replays every header, Set-Cookie included
	keeps5xx               // keeps and replays a 5xx
	noReplay               // requires a key, and then ignores it
	cookiesToWaiters       // replays Set-Cookie to a duplicate that waited for the first
	conflictsInFlight      // not a flaw: a duplicate in flight gets 409 with Retry-After
	conflictsNoRetry       // a duplicate in flight gets 409 without Retry-After
)

// fakeAPI is a small idempotent endpoint at /pay, written by hand, with at
// most one flaw. GET /count answers how many payments ran. It honours
// Idem-Fault: fail-before-commit (503, no effect) and delay=DURATION.
type fakeAPI struct {
	flaw     flaw
	requests atomic.Int64 // every request, /count included

	mu       sync.Mutex
	payments int
	keys     map[string]*fakeRecord
	pairs    map[string]*pairing
}

type fakeRecord struct {
	body   string
	done   chan struct{} // closed when the first execution ends
	status int           // 0 while in flight, or when released
	header http.Header
	resp   []byte
}

// pairing makes the first two executions of one key meet, so that a flawed
// check-then-run endpoint really runs concurrent duplicates twice.
type pairing struct {
	met  chan struct{}
	once sync.Once
}

func newFakeAPI(t *testing.T, f flaw) (*fakeAPI, *httptest.Server) {
	api := &fakeAPI{flaw: f, keys: map[string]*fakeRecord{}, pairs: map[string]*pairing{}}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return api, srv
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	if r.Method == http.MethodGet && r.URL.Path == "/count" {
		f.mu.Lock()
		n := f.payments
		f.mu.Unlock()
		fmt.Fprint(w, n)
		return
	}
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 || strings.ContainsFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		http.Error(w, `{"error":"bad key"}`, http.StatusBadRequest)
		return
	}
	switch f.flaw {
	case noReplay:
		f.execute(w, r, body)
		return
	case noAtomicClaim:
		f.mu.Lock()
		rec := f.keys[key]
		f.mu.Unlock()
		switch {
		case rec != nil && rec.body != string(body):
			http.Error(w, `{"error":"key reused"}`, http.StatusUnprocessableEntity)
			return
		case rec != nil:
			f.replay(w, rec)
			return
		}
		f.meet(key)
		rec = &fakeRecord{body: string(body)}
		rec.status, rec.header, rec.resp = f.record(w, r, body)
		if rec.status < 500 {
			f.mu.Lock()
			f.keys[key] = rec
			f.mu.Unlock()
		}
		return
	}
	for {
		f.mu.Lock()
		rec := f.keys[key]
		if rec == nil {
			rec = &fakeRecord{body: string(body), done: make(chan struct{})}
			f.keys[key] = rec
			f.mu.Unlock()
			status, header, resp := f.record(w, r, body)
			f.mu.Lock()
			if status >= 500 && f.flaw != keeps5xx {
				delete(f.keys, key)
			} else {
				rec.status, rec.header, rec.resp = status, header, resp
			}
			close(rec.done)
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		if rec.body != string(body) && f.flaw != noMismatchCheck {
			http.Error(w, `{"error":"key reused"}`, http.StatusUnprocessableEntity)
			return
		}
		waited := false
		select {
		case <-rec.done:
		default:
			switch f.flaw {
			case conflictsInFlight:
				w.Header().Set("Retry-After", "1")
				fallthrough
			case conflictsNoRetry:
				http.Error(w, `{"error":"in flight"}`, http.StatusConflict)
				return
			}
			waited = true
			<-rec.done
		}
		f.mu.Lock()
		kept := f.keys[key] == rec
		f.mu.Unlock()
		if kept {
			if waited && f.flaw == cookiesToWaiters {
				w.Header().Set("Set-Cookie", rec.header.Get("Set-Cookie"))
			}
			f.replay(w, rec)
			return
		}
		// Released after a failure: this request claims it again.
	}
}

// meet waits until a second execution of key arrives, or a moment passes.
func (f *fakeAPI) meet(key string) {
	f.mu.Lock()
	p := f.pairs[key]
	if p == nil {
		p = &pairing{met: make(chan struct{})}
		f.pairs[key] = p
		f.mu.Unlock()
		select {
		case <-p.met:
		case <-time.After(300 * time.Millisecond): // a duplicate would have come by now
		}
		return
	}
	f.mu.Unlock()
	p.once.Do(func() { close(p.met) })
}

// record executes and returns what it answered, as the middleware keeps it.
func (f *fakeAPI) record(w http.ResponseWriter, r *http.Request, body []byte) (int, http.Header, []byte) {
	rec := httptest.NewRecorder()
	f.execute(rec, r, body)
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
	return rec.Code, rec.Header().Clone(), rec.Body.Bytes()
}

func (f *fakeAPI) execute(w http.ResponseWriter, r *http.Request, body []byte) {
	fault := r.Header.Get("Idem-Fault")
	if d, ok := strings.CutPrefix(fault, "delay="); ok {
		dur, _ := time.ParseDuration(d)
		select {
		case <-time.After(dur): // the delay the client asked for
		case <-r.Context().Done():
			return
		}
	}
	if fault == "fail-before-commit" {
		http.Error(w, `{"error":"injected"}`, http.StatusServiceUnavailable)
		return
	}
	f.mu.Lock()
	f.payments++
	id := "pay_" + strconv.Itoa(f.payments)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/pay/"+id)
	w.Header().Set("Set-Cookie", "session=s3cret-session; HttpOnly")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"request":%s}`, id, body)
}

func (f *fakeAPI) replay(w http.ResponseWriter, rec *fakeRecord) {
	for _, h := range []string{"Content-Type", "Location"} {
		w.Header().Set(h, rec.header.Get(h))
	}
	if f.flaw == replaysCookies {
		w.Header().Set("Set-Cookie", rec.header.Get("Set-Cookie"))
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(rec.status)
	w.Write(rec.resp)
}

func fakeConfig(srv *httptest.Server) *probe.Config {
	return &probe.Config{
		URL:         srv.URL + "/pay",
		Body:        `{"amount":{{n}}}`,
		Header:      http.Header{"Authorization": {"Bearer s3cret-token"}},
		CountURL:    srv.URL + "/count",
		FaultHeader: "Idem-Fault: fail-before-commit",
		SlowHeader:  "Idem-Fault: delay=300ms",
		Timeout:     30 * time.Second,
	}
}

// verdicts maps each check's name to its status.
func verdicts(rep *probe.Report) map[string]probe.Status {
	m := map[string]probe.Status{}
	for _, c := range rep.Checks {
		m[c.Name] = c.Status
	}
	return m
}

func notPassing(rep *probe.Report) []string {
	var names []string
	for _, c := range rep.Checks {
		if c.Status == probe.Fail || c.Status == probe.Error {
			names = append(names, c.Name)
		}
	}
	return names
}

func text(t *testing.T, rep *probe.Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestCorrectEndpointPassesEveryCheck(t *testing.T) {
	t.Parallel()
	for _, counted := range []bool{true, false} {
		t.Run(fmt.Sprintf("count=%v", counted), func(t *testing.T) {
			t.Parallel()
			api, srv := newFakeAPI(t, correct)
			cfg := fakeConfig(srv)
			if !counted {
				cfg.CountURL = ""
			}
			rep, err := probe.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			out := text(t, rep)
			if !rep.OK() || len(rep.Checks) != 9 {
				t.Fatalf("report not OK or not 9 checks:\n%s", out)
			}
			for name, s := range verdicts(rep) {
				if s != probe.Pass {
					t.Errorf("check %s: %s, want pass:\n%s", name, s, out)
				}
			}
			if int64(rep.Requests) != api.requests.Load() {
				t.Errorf("report counts %d requests, the server saw %d", rep.Requests, api.requests.Load())
			}
		})
	}
}

func TestEachFlawFailsItsCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		flaw flaw
		fail []string
	}{
		{"no atomic claim", noAtomicClaim, []string{"concurrent-duplicates", "in-flight-duplicate"}},
		{"mismatch not checked", noMismatchCheck, []string{"key-reuse-refused"}},
		{"credentials replayed", replaysCookies, []string{"no-credentials-replayed"}},
		{"5xx kept", keeps5xx, []string{"5xx-not-kept"}},
		{"credentials replayed to waiting duplicates", cookiesToWaiters, []string{"no-credentials-replayed"}},
		{"409 without Retry-After", conflictsNoRetry, []string{"in-flight-duplicate"}},
		{"409 with Retry-After", conflictsInFlight, nil},
		{"no replay at all", noReplay, []string{"concurrent-duplicates", "sequential-replay", "key-reuse-refused", "lost-response", "in-flight-duplicate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, srv := newFakeAPI(t, tc.flaw)
			rep, err := probe.Run(t.Context(), fakeConfig(srv))
			if err != nil {
				t.Fatal(err)
			}
			out := text(t, rep)
			if got := notPassing(rep); !slices.Equal(got, tc.fail) {
				t.Errorf("checks not passing = %v, want %v:\n%s", got, tc.fail, out)
			}
			if rep.OK() != (len(tc.fail) == 0) {
				t.Errorf("report OK = %v, with %d checks failing", rep.OK(), len(tc.fail))
			}
			for _, name := range tc.fail {
				if !strings.Contains(out, "("+name+")") {
					t.Errorf("the evidence does not name %s:\n%s", name, out)
				}
			}
		})
	}
}

func TestNeverShowsCredentials(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, replaysCookies)
	cfg := fakeConfig(srv)
	cfg.Header.Set("X-Api-Key", "s3cret-api-key")
	cfg.Header.Set("Cookie", "session=s3cret-cookie")
	cfg.SecretHeaders = []string{"x-api-key"}
	rep, err := probe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	// Every exchange of the JSON report, for the text one shows failures only.
	for _, out := range []string{text(t, rep), js.String()} {
		if strings.Contains(out, "s3cret") {
			t.Errorf("the report shows a secret:\n%s", out)
		}
	}
	if !strings.Contains(js.String(), "Bearer xxxxx") || !strings.Contains(js.String(), "session=xxxxx") {
		t.Errorf("the JSON report lacks the redacted credentials:\n%s", js.String())
	}
}

func TestRefusesRemoteTargets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, count string }{
		{"http://192.0.2.1/pay", ""},          // TEST-NET-1: never a loopback
		{"http://[2001:db8::1]:8080/pay", ""}, // documentation range
		{"http://127.0.0.1:1/pay", "http://192.0.2.1/count"},
	} {
		_, err := probe.Run(t.Context(), &probe.Config{URL: tc.url, CountURL: tc.count})
		if !errors.Is(err, probe.ErrRemote) {
			t.Errorf("Run(%s, count %q) = %v, want ErrRemote", tc.url, tc.count, err)
		}
	}
}

func TestRespectsMaxRequests(t *testing.T) {
	t.Parallel()
	for _, max := range []int{3, 12, 25} {
		api, srv := newFakeAPI(t, correct)
		cfg := fakeConfig(srv)
		cfg.MaxRequests = max
		rep, err := probe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("max %d: %v", max, err)
		}
		if got := api.requests.Load(); got > int64(max) {
			t.Errorf("max %d: the server saw %d requests", max, got)
		}
		if rep.OK() {
			t.Errorf("max %d: report OK though checks could not run:\n%s", max, text(t, rep))
		}
		if out := text(t, rep); !strings.Contains(out, "budget") {
			t.Errorf("max %d: the report does not say the budget ran out:\n%s", max, out)
		}
	}
}

func TestBaselineMustSucceed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "send an API key", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	_, err := probe.Run(t.Context(), &probe.Config{URL: srv.URL})
	if !errors.Is(err, probe.ErrBaseline) || !strings.Contains(err.Error(), "401") {
		t.Errorf("Run against a 401 = %v, want ErrBaseline naming 401", err)
	}
}

func TestEndpointWithoutRequiredKeys(t *testing.T) {
	t.Parallel()
	// Keys optional: a request without one runs, unprotected.
	api, srv := newFakeAPI(t, correct)
	optional := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "" && r.Method == http.MethodPost {
			api.execute(w, r, nil)
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(optional.Close)
	cfg := fakeConfig(srv)
	cfg.URL = optional.URL + "/pay"
	rep, err := probe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "missing-key-refused" && (c.Status != probe.NotApplicable || !strings.Contains(c.Reason, "does not require keys")) {
			t.Errorf("missing key check: %s %q, want n/a saying keys are not required", c.Status, c.Reason)
		}
	}
	if !rep.OK() {
		t.Errorf("report not OK:\n%s", text(t, rep))
	}
}

func TestJSONReport(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, keeps5xx)
	rep, err := probe.Run(t.Context(), fakeConfig(srv))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Checks []struct {
			Number   int
			Name     string
			Source   string
			Status   string
			Evidence []json.RawMessage
		}
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	wantNumbers := []int{1, 2, 3, 4, 4, 5, 6, 7, 8}
	if len(got.Checks) != len(wantNumbers) {
		t.Fatalf("%d checks, want %d", len(got.Checks), len(wantNumbers))
	}
	for i, c := range got.Checks {
		if c.Number != wantNumbers[i] || c.Name == "" || c.Source == "" {
			t.Errorf("check %d: %+v", i, c)
		}
		if c.Name == "5xx-not-kept" && (c.Status != "fail" || len(c.Evidence) == 0) {
			t.Errorf("5xx check: status %s with %d exchanges, want fail with evidence", c.Status, len(c.Evidence))
		}
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []probe.Config{
		{URL: ""},
		{URL: "ftp://127.0.0.1/x"},
		{URL: "http://127.0.0.1/x", Concurrency: 1},
		{URL: "http://127.0.0.1/x", MaxRequests: -1},
		{URL: "http://127.0.0.1/x", FaultHeader: "no colon"},
	} {
		if _, err := probe.Run(t.Context(), &cfg); !errors.Is(err, probe.ErrInvalidConfig) {
			t.Errorf("Run(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestSlowHeaderThatDoesNotSlow(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, correct)
	cfg := fakeConfig(srv)
	cfg.SlowHeader = "X-Ignored: 1"
	rep, err := probe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "in-flight-duplicate" && (c.Status != probe.Error || !strings.Contains(c.Reason, "did not hold it")) {
			t.Errorf("in-flight check: %s %q, want an error saying the request was not held", c.Status, c.Reason)
		}
	}
	if rep.OK() {
		t.Error("report OK though check 8 could not run")
	}
}

func TestTimeoutBoundsTheProbe(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	}))
	t.Cleanup(srv.Close)
	start := time.Now()
	_, err := probe.Run(t.Context(), &probe.Config{URL: srv.URL, Timeout: 200 * time.Millisecond})
	if !errors.Is(err, probe.ErrBaseline) || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("Run against a server that never answers = %v, want ErrBaseline naming the timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %s with a timeout of 200ms", d)
	}
}
