package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A handler that panics gets its client a 500 handler-failed problem that
// says what happened and that nothing was kept, and the key is released:
// the retry with the same key runs the handler again.
func TestPanickingHandlerAnswersHandlerFailedAndReleases(t *testing.T) {
	t.Parallel()
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if runs == 1 {
			panic("card network unreachable")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	post := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":5}`))
		req.Header.Set(idemhttp.HeaderKey, "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	w := post()
	var p struct{ Type, Detail string }
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusInternalServerError ||
		!strings.HasSuffix(p.Type, "handler-failed") || p.Detail != "The request panicked and was not completed. Retry with the same key." {
		t.Fatalf("a panicking handler's answer: %d %s (%v); want 500 handler-failed saying it panicked and was not completed", w.Code, w.Body, err)
	}
	if w := post(); w.Code != http.StatusCreated || runs != 2 {
		t.Fatalf("the retry: %d, handler ran %d times; want it run again (201)", w.Code, runs)
	}
}
