package idemprom

import (
	"github.com/idem-go/idem/idemhttp"
	"github.com/prometheus/client_golang/prometheus"
)

const requestsHelp = "Requests seen by an idempotency middleware, by outcome: executed, replayed, conflict (409 in flight), mismatch (422), released (transient failure), store_error, lease_lost, rejected (400/413), aborted."

// middlewareCollector reads the middleware's counters at scrape time, so
// counting costs the request path one atomic add and nothing else.
type middlewareCollector struct {
	desc *prometheus.Desc
	m    *idemhttp.Middleware
}

func (c *middlewareCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *middlewareCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.m.Counts()
	for _, o := range idemhttp.Outcomes {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(counts[o]), string(o))
	}
}

// NewMiddlewareCollector returns a collector of m's counters labelled
// middleware=name.
func NewMiddlewareCollector(name string, m *idemhttp.Middleware) prometheus.Collector {
	// The middleware's name is a constant label of its own descriptor, so
	// the registry can tell several middlewares' collectors apart.
	desc := prometheus.NewDesc("idem_http_requests_total", requestsHelp,
		[]string{"outcome"}, prometheus.Labels{"middleware": name})
	return &middlewareCollector{desc: desc, m: m}
}

// RegisterMiddleware registers m's counters on reg under the label
// middleware=name. Two middlewares need two names.
func RegisterMiddleware(reg prometheus.Registerer, name string, m *idemhttp.Middleware) error {
	return reg.Register(NewMiddlewareCollector(name, m))
}
