package idemprom_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRegisterMiddleware(t *testing.T) {
	t.Parallel()
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterMiddleware(reg, "api", m); err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for i := 0; i < 2; i++ {
		req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.HeaderKey, "k1")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/x", nil)) // no key: rejected

	want := `
# HELP idem_http_requests_total Requests seen by an idempotency middleware, by outcome: executed, replayed, conflict (409 in flight), mismatch (422), released (transient failure), store_error, lease_lost, rejected (400/413), aborted, unfinished (failed after a recovery point; left for a retry or a completer).
# TYPE idem_http_requests_total counter
idem_http_requests_total{middleware="api",outcome="aborted"} 0
idem_http_requests_total{middleware="api",outcome="conflict"} 0
idem_http_requests_total{middleware="api",outcome="executed"} 1
idem_http_requests_total{middleware="api",outcome="lease_lost"} 0
idem_http_requests_total{middleware="api",outcome="mismatch"} 0
idem_http_requests_total{middleware="api",outcome="rejected"} 1
idem_http_requests_total{middleware="api",outcome="released"} 0
idem_http_requests_total{middleware="api",outcome="replayed"} 1
idem_http_requests_total{middleware="api",outcome="store_error"} 0
idem_http_requests_total{middleware="api",outcome="unfinished"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if err := idemprom.RegisterMiddleware(reg, "api", m); err == nil {
		t.Fatal("registering the same name twice succeeded; want an error")
	}
	other, _ := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err := idemprom.RegisterMiddleware(reg, "other", other); err != nil {
		t.Fatalf("a second middleware under another name: %v", err)
	}
}
