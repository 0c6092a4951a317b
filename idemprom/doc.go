// Package idemprom exports idem's counters to Prometheus.
//
// The toolkit's packages count what they do without importing a metrics
// library; this package turns those counts into Prometheus collectors, so
// only programs that want Prometheus depend on it.
//
//	m, _ := idemhttp.New(&idemhttp.Config{Store: store, Scope: scopeByTenant})
//	reg := prometheus.NewRegistry()
//	idemprom.RegisterMiddleware(reg, "payments", m)
//
// exports idem_http_requests_total{middleware="payments",outcome="replayed"}
// and its siblings, one series per idemhttp.Outcome. An alert on the rate of
// outcome="store_error" or outcome="lease_lost" is the first one to write.
package idemprom
