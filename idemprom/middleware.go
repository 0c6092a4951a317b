package idemprom

import (
	"context"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/keyed"
	"github.com/prometheus/client_golang/prometheus"
)

// A face's metrics are named for it: idem_http_… for idemhttp's
// middlewares, idem_grpc_… for idemgrpc's interceptors, each series
// labelled middleware=name (on gRPC, the interceptor's name). The two
// faces count the same outcomes, phases and store operations (the engine
// in package keyed is theirs), so a query on one reads the same on the
// other, and an alert covers both with "or".
type face struct {
	prefix string // "idem_http_" or "idem_grpc_"
	// The help texts of requests_total, request_duration_seconds,
	// phase_duration_seconds and store_duration_seconds.
	requests, duration, phase, store string
}

var (
	httpFace = face{prefix: "idem_http_",
		requests: "Requests seen by an idempotency middleware, by outcome: executed, replayed, conflict (409 in flight), mismatch (422), released (transient failure), store_error, lease_lost, rejected (400/413), aborted, unfinished (failed after a recovery point; left for a retry or a completer).",
		duration: "Protected requests' time in the idempotency middleware, handler included, by outcome.",
		phase:    "Time of each phase of a protected request: claim (waits for an execution in flight included), handler, complete (keep the answer or release the key), replay.",
		store:    "Round trips of the idempotency middleware to its key store, by operation: claim, complete, release, get, replay.",
	}
	grpcFace = face{prefix: "idem_grpc_",
		requests: "Calls seen by an idempotency interceptor (idemgrpc), by outcome: executed, replayed, conflict (Aborted: in flight), mismatch (FailedPrecondition), released (transient failure), store_error, lease_lost, rejected (InvalidArgument: no key, a bad key), aborted, unfinished (failed after a recovery point; left for a retry or a completer).",
		duration: "Protected calls' time in the idempotency interceptor, handler included, by outcome.",
		phase:    "Time of each phase of a protected call: claim (waits for an execution in flight included), handler, complete (keep the answer or release the key), replay.",
		store:    "Round trips of the idempotency interceptor to its key store, by operation: claim, complete, release, get, replay.",
	}
)

// Counter is what counts a face's outcomes: idemhttp.Middleware and
// idemgrpc.Interceptor (their Counts).
type Counter interface {
	Counts() map[keyed.Outcome]uint64
}

// middlewareCollector reads a face's counters at scrape time, so
// counting costs the request path one atomic add and nothing else.
type middlewareCollector struct {
	desc *prometheus.Desc
	m    Counter
}

func (c *middlewareCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *middlewareCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.m.Counts()
	for _, o := range keyed.Outcomes {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(counts[o]), string(o))
	}
}

func newCounterCollector(f face, name string, m Counter) prometheus.Collector {
	// The middleware's name is a constant label of its own descriptor, so
	// the registry can tell several middlewares' collectors apart.
	desc := prometheus.NewDesc(f.prefix+"requests_total", f.requests,
		[]string{"outcome"}, prometheus.Labels{"middleware": name})
	return &middlewareCollector{desc: desc, m: m}
}

// NewMiddlewareCollector returns a collector of m's counters labelled
// middleware=name: idem_http_requests_total{outcome}.
func NewMiddlewareCollector(name string, m *idemhttp.Middleware) prometheus.Collector {
	return newCounterCollector(httpFace, name, m)
}

// RegisterMiddleware registers m's counters on reg under the label
// middleware=name. Two middlewares need two names.
func RegisterMiddleware(reg prometheus.Registerer, name string, m *idemhttp.Middleware) error {
	return reg.Register(NewMiddlewareCollector(name, m))
}

// NewGRPCCollector returns a collector of the counters of i, an
// idemgrpc.Interceptor, labelled middleware=name:
// idem_grpc_requests_total{outcome}, the gRPC face's
// idem_http_requests_total.
func NewGRPCCollector(name string, i Counter) prometheus.Collector {
	return newCounterCollector(grpcFace, name, i)
}

// RegisterGRPC registers the counters of i, an idemgrpc.Interceptor, on
// reg under the label middleware=name.
func RegisterGRPC(reg prometheus.Registerer, name string, i Counter) error {
	return reg.Register(NewGRPCCollector(name, i))
}

// latencyBuckets span half a millisecond (a claim in memory) to some
// eight seconds (a handler waiting on a slow dependency).
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 15)

// MiddlewareObserver is an idemhttp.Observer that keeps latency
// histograms, and the prometheus.Collector that exports them:
//
//   - idem_http_request_duration_seconds{middleware, outcome}: whole
//     protected requests, by idemhttp.Outcome;
//   - idem_http_phase_duration_seconds{middleware, phase}: claim (waits for
//     an execution in flight included), handler, complete, replay;
//   - idem_http_store_duration_seconds{middleware, op}: each round trip to
//     the key store (claim, complete, release, get, replay).
//
// Give it to idemhttp.Config.Observer and register it. Observing costs a
// request a few histogram observations. NewGRPCObserver makes the gRPC
// face's, named idem_grpc_….
type MiddlewareObserver struct {
	requests, phases, store *prometheus.HistogramVec
	// Looked up once, so the request path looks no label up; the maps are
	// only read after NewMiddlewareObserver.
	phase   [idemhttp.PhaseReplay + 1]prometheus.Observer
	outcome map[idemhttp.Outcome]prometheus.Observer
	op      map[idemhttp.StoreOp]prometheus.Observer
}

var _ idemhttp.Observer = (*MiddlewareObserver)(nil)

// NewMiddlewareObserver returns the histograms of the middleware it is
// given to, labelled middleware=name.
func NewMiddlewareObserver(name string) *MiddlewareObserver { return newObserver(httpFace, name) }

// NewGRPCObserver returns the histograms of the idemgrpc.Interceptor it is
// given to (idemgrpc.Config.Observer), labelled middleware=name:
// idem_grpc_request_duration_seconds{outcome},
// idem_grpc_phase_duration_seconds{phase} and
// idem_grpc_store_duration_seconds{op}, the gRPC face's idem_http_….
func NewGRPCObserver(name string) *MiddlewareObserver { return newObserver(grpcFace, name) }

func newObserver(f face, name string) *MiddlewareObserver {
	labels := prometheus.Labels{"middleware": name}
	o := &MiddlewareObserver{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: f.prefix + "request_duration_seconds", ConstLabels: labels, Buckets: latencyBuckets,
			Help: f.duration,
		}, []string{"outcome"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: f.prefix + "phase_duration_seconds", ConstLabels: labels, Buckets: latencyBuckets,
			Help: f.phase,
		}, []string{"phase"}),
		store: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: f.prefix + "store_duration_seconds", ConstLabels: labels, Buckets: latencyBuckets,
			Help: f.store,
		}, []string{"op"}),
	}
	for p := idemhttp.PhaseClaim; p <= idemhttp.PhaseReplay; p++ {
		o.phase[p] = o.phases.WithLabelValues(p.String())
	}
	o.outcome = make(map[idemhttp.Outcome]prometheus.Observer, len(idemhttp.Outcomes))
	for _, out := range idemhttp.Outcomes {
		o.outcome[out] = o.requests.WithLabelValues(string(out))
	}
	o.op = make(map[idemhttp.StoreOp]prometheus.Observer)
	for _, op := range []idemhttp.StoreOp{idemhttp.StoreClaim, idemhttp.StoreComplete, idemhttp.StoreRelease, idemhttp.StoreGet, idemhttp.StoreReplay} {
		o.op[op] = o.store.WithLabelValues(string(op))
	}
	return o
}

// Begin implements idemhttp.Observer; it carries nothing.
func (o *MiddlewareObserver) Begin(ctx context.Context, _ idemhttp.Event) context.Context { return ctx }

// End implements idemhttp.Observer.
func (o *MiddlewareObserver) End(_ context.Context, e idemhttp.Event) {
	switch {
	case e.Phase == idemhttp.PhaseRequest:
		if h, ok := o.outcome[e.Outcome]; ok {
			h.Observe(e.Duration.Seconds())
		}
	case e.Phase == idemhttp.PhaseReplay && e.Status == 0:
		// Not answered from the record: the claim answers, and is timed.
	case int(e.Phase) < len(o.phase):
		o.phase[e.Phase].Observe(e.Duration.Seconds())
	}
}

// Store implements idemhttp.Observer.
func (o *MiddlewareObserver) Store(_ context.Context, op idemhttp.StoreOp, d time.Duration, _ error) {
	if h, ok := o.op[op]; ok {
		h.Observe(d.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (o *MiddlewareObserver) Describe(ch chan<- *prometheus.Desc) {
	o.requests.Describe(ch)
	o.phases.Describe(ch)
	o.store.Describe(ch)
}

// Collect implements prometheus.Collector.
func (o *MiddlewareObserver) Collect(ch chan<- prometheus.Metric) {
	o.requests.Collect(ch)
	o.phases.Collect(ch)
	o.store.Collect(ch)
}
