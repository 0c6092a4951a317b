package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// FuzzMiddleware sends whatever a client could send (method, path and
// query, Idempotency-Key header, Content-Type, body), three times at once
// and once more after, through the middleware in front of a handler that
// counts its executions, and checks the promise: one key never runs the
// handler twice for the same request, a duplicate gets the first answer,
// and bad input gets a 4xx, never a 5xx (the handler itself never fails).
func FuzzMiddleware(f *testing.F) {
	for _, s := range []struct{ method, target, key, ctype, body string }{
		{"POST", "/pay", "k-1", "application/json", `{"amount":100}`},
		{"POST", "/pay?b=2&a=1", `"8e03978e-40d5"`, "application/json; charset=utf-8", `{"b":[1,2,{"c":null}],"a":1e3}`},
		{"PUT", "/pay", "", "text/plain", "hello"},
		{"POST", "/pay", "k\x00y", "application/json", `{"a":1,"a":2}`},
		{"POST", "/%zz", " \t", "application/json", "{\"a\":\"\\ud800\"}"},
		{"PATCH", "/pay", strings.Repeat("k", 300), "", "\xff\xfe"},
		{"POST", "/pay", "\"unterminated", "application/merge-patch+json", `[`},
		{"GET", "/pay", "k-2", "", ""},
	} {
		f.Add(s.method, s.target, s.key, s.ctype, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method, target, key, ctype string, body []byte) {
		if !validMethod(method) || !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \t\r\n#") ||
			strings.ContainsAny(key+ctype, "\r\n") {
			t.Skip("not a request a server could parse")
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			t.Skip("not a request a server could parse")
		}
		store := idemmem.NewStore(nil)
		var executions atomic.Int64
		m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: store})
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := executions.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"execution":` + string(rune('0'+n%10)) + `}`))
		}))
		send := func() *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, target, strings.NewReader(string(body)))
			if key != "" {
				req.Header.Set(idemhttp.HeaderKey, key)
			}
			if ctype != "" {
				req.Header.Set("Content-Type", ctype)
			}
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			return rr
		}
		var (
			wg      sync.WaitGroup
			answers [4]*httptest.ResponseRecorder
		)
		for i := range 3 {
			wg.Go(func() { answers[i] = send() })
		}
		wg.Wait()
		answers[3] = send()

		_, keyErr := idem.ParseKey(key)
		protected := key != "" && keyErr == nil && (method == http.MethodPost || method == http.MethodPatch)
		for i, a := range answers {
			if a.Code >= 500 {
				t.Fatalf("answer %d: %d %s: a 5xx for a request the handler never fails", i, a.Code, a.Body)
			}
		}
		if !protected {
			return
		}
		if n := executions.Load(); n > 1 {
			t.Fatalf("%d executions under one key for one request", n)
		}
		// Every answer is the first execution's, or a 409 for a duplicate
		// that found it in flight, or the same refusal for all.
		var first *httptest.ResponseRecorder
		for _, a := range answers {
			if a.Code == http.StatusCreated {
				if first == nil {
					first = a
				} else if a.Body.String() != first.Body.String() {
					t.Fatalf("two answers for one key: %q and %q", first.Body, a.Body)
				}
			}
		}
		if executions.Load() == 1 && answers[3].Code != http.StatusCreated {
			t.Fatalf("after the execution, a duplicate got %d %s, want the replay", answers[3].Code, answers[3].Body)
		}
	})
}

// validMethod reports whether m is a token net/http would accept as a
// method.
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range m {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, c) {
			return false
		}
	}
	return true
}
