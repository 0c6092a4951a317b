package idemprom

import (
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/keyed"
	"github.com/prometheus/client_golang/prometheus"
)

// completerCollector reads a Completer's Stats at scrape time.
type completerCollector struct {
	unknown, oldest, ended, failed *prometheus.Desc
	c                              *keyed.Completer
}

// NewCompleterCollector returns a collector of c's figures, labelled
// middleware=name:
//
//   - idem_http_recovery_unknown: keys in flight with a recovery point
//     whose last Resume failed, outcomes nobody has learned yet (never
//     released; alert when one stays);
//   - idem_http_recovery_oldest_unknown_seconds: how long ago the oldest of
//     them first failed, 0 when there is none;
//   - idem_http_recovered_total{result}: abandoned executions the completer
//     ended, completed or released;
//   - idem_http_recovery_failures_total: Resume calls that failed.
func NewCompleterCollector(name string, c *idemhttp.Completer) prometheus.Collector {
	return newCompleterCollector(httpFace, name, c)
}

// NewGRPCCompleterCollector returns a collector of the figures of c, an
// idemgrpc.Completer, labelled middleware=name: idem_grpc_recovery_unknown,
// idem_grpc_recovery_oldest_unknown_seconds, idem_grpc_recovered_total
// and idem_grpc_recovery_failures_total, the gRPC face's idem_http_….
func NewGRPCCompleterCollector(name string, c *keyed.Completer) prometheus.Collector {
	return newCompleterCollector(grpcFace, name, c)
}

func newCompleterCollector(f face, name string, c *keyed.Completer) prometheus.Collector {
	labels := prometheus.Labels{"middleware": name}
	return &completerCollector{
		unknown: prometheus.NewDesc(f.prefix+"recovery_unknown",
			"Keys in flight with a recovery point whose outcome the completer could not learn yet; never released.", nil, labels),
		oldest: prometheus.NewDesc(f.prefix+"recovery_oldest_unknown_seconds",
			"Seconds since the oldest unknown outcome's first failed resume; 0 when there is none.", nil, labels),
		ended: prometheus.NewDesc(f.prefix+"recovered_total",
			"Abandoned executions the completer ended, by result: completed (answer kept) or released (nothing was done).", []string{"result"}, labels),
		failed: prometheus.NewDesc(f.prefix+"recovery_failures_total",
			"Resumes of abandoned executions that failed, leaving the outcome unknown until the next try.", nil, labels),
		c: c,
	}
}

func (cc *completerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cc.unknown
	ch <- cc.oldest
	ch <- cc.ended
	ch <- cc.failed
}

func (cc *completerCollector) Collect(ch chan<- prometheus.Metric) {
	s := cc.c.Stats()
	ch <- prometheus.MustNewConstMetric(cc.unknown, prometheus.GaugeValue, float64(s.Unknown))
	ch <- prometheus.MustNewConstMetric(cc.oldest, prometheus.GaugeValue, s.UnknownFor.Seconds())
	ch <- prometheus.MustNewConstMetric(cc.ended, prometheus.CounterValue, float64(s.Completed), "completed")
	ch <- prometheus.MustNewConstMetric(cc.ended, prometheus.CounterValue, float64(s.Released), "released")
	ch <- prometheus.MustNewConstMetric(cc.failed, prometheus.CounterValue, float64(s.Failed))
}
