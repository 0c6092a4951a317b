package idemprom_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
)

// A MiddlewareObserver times every protected request by outcome, each of
// its phases and each round trip to the key store: one payment executed
// (claim, handler, complete) and its duplicate replayed, from the answer
// the middleware kept in memory (no round trip; see
// idemhttp.Config.MemoryReplayFor).
func ExampleMiddlewareObserver() {
	histograms := idemprom.NewMiddlewareObserver("payments")
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Observer: histograms})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(histograms)
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set(idemhttp.HeaderKey, "order-42")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			if n := metric.GetHistogram().GetSampleCount(); n > 0 {
				fmt.Printf("%s %v %d\n", f.GetName(), labels(metric.GetLabel()), n)
			}
		}
	}
	// Output:
	// idem_http_phase_duration_seconds map[middleware:payments phase:claim] 1
	// idem_http_phase_duration_seconds map[middleware:payments phase:complete] 1
	// idem_http_phase_duration_seconds map[middleware:payments phase:handler] 1
	// idem_http_phase_duration_seconds map[middleware:payments phase:replay] 1
	// idem_http_request_duration_seconds map[middleware:payments outcome:executed] 1
	// idem_http_request_duration_seconds map[middleware:payments outcome:replayed] 1
	// idem_http_store_duration_seconds map[middleware:payments op:claim] 1
	// idem_http_store_duration_seconds map[middleware:payments op:complete] 1
}
