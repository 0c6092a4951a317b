package idemprom_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
)

// A middleware's outcomes become idem_http_requests_total{middleware,
// outcome}: one payment executed, its two duplicates replayed.
func ExampleRegisterMiddleware() {
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterMiddleware(reg, "payments", m); err != nil {
		panic(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for range 3 {
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
			if v := metric.GetCounter().GetValue(); v > 0 {
				fmt.Printf("%s %v %v\n", f.GetName(), labels(metric.GetLabel()), v)
			}
		}
	}
	// Output:
	// idem_http_requests_total map[middleware:payments outcome:executed] 1
	// idem_http_requests_total map[middleware:payments outcome:replayed] 2
}

func labels(pairs []*dto.LabelPair) map[string]string {
	m := map[string]string{}
	for _, p := range pairs {
		m[p.GetName()] = p.GetValue()
	}
	return m
}
