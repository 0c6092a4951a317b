package idemprom

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
)

// RelayObserver is an outbox.Observer that counts and times a relay's
// passes, and the prometheus.Collector that exports them:
//
//   - idem_outbox_relayed_total{relay}: entries published (or moved) and
//     marked sent;
//   - idem_outbox_pass_failures_total{relay}: passes that failed (the
//     relay retries them after its backoff);
//   - idem_outbox_pass_duration_seconds{relay}: passes that relayed
//     something or failed;
//   - idem_outbox_relay_delay_seconds{relay}: for each pass that published
//     the long way, how long its oldest entry waited in the outbox.
//
// Give it to outbox.Config.Observer and register it.
type RelayObserver struct {
	relayed, failures *prometheus.CounterVec
	duration, delay   *prometheus.HistogramVec
}

var _ outbox.Observer = (*RelayObserver)(nil)

// NewRelayObserver returns the metrics of the relay it is given to,
// labelled relay=name. The name is the relay's role ("payments"), not its
// lease holder's random Config.Name, so that restarts keep one series.
func NewRelayObserver(name string) *RelayObserver {
	labels := prometheus.Labels{"relay": name}
	o := &RelayObserver{
		relayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outbox_relayed_total", ConstLabels: labels,
			Help: "Outbox entries the relay published (or had moved) and marked sent.",
		}, nil),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outbox_pass_failures_total", ConstLabels: labels,
			Help: "Relay passes that failed; the relay keeps the batch and tries again after its backoff.",
		}, nil),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idem_outbox_pass_duration_seconds", ConstLabels: labels, Buckets: latencyBuckets,
			Help: "Time of the relay's passes that relayed something or failed.",
		}, nil),
		delay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idem_outbox_relay_delay_seconds", ConstLabels: labels, Buckets: lagBuckets,
			Help: "How long the oldest entry of each pass published waited in the outbox.",
		}, nil),
	}
	// Every series from the start, so rate() has a zero to begin with.
	o.relayed.WithLabelValues()
	o.failures.WithLabelValues()
	o.duration.WithLabelValues()
	o.delay.WithLabelValues()
	return o
}

// Pass implements outbox.Observer.
func (o *RelayObserver) Pass(_ context.Context, p outbox.Pass) {
	o.relayed.WithLabelValues().Add(float64(p.Sent))
	if p.Err != nil {
		o.failures.WithLabelValues().Inc()
	}
	o.duration.WithLabelValues().Observe(p.Duration.Seconds())
	if !p.Oldest.IsZero() {
		o.delay.WithLabelValues().Observe(max(p.Start.Add(p.Duration).Sub(p.Oldest).Seconds(), 0))
	}
}

// Describe implements prometheus.Collector.
func (o *RelayObserver) Describe(ch chan<- *prometheus.Desc) {
	o.relayed.Describe(ch)
	o.failures.Describe(ch)
	o.duration.Describe(ch)
	o.delay.Describe(ch)
}

// Collect implements prometheus.Collector.
func (o *RelayObserver) Collect(ch chan<- prometheus.Metric) {
	o.relayed.Collect(ch)
	o.failures.Collect(ch)
	o.duration.Collect(ch)
	o.delay.Collect(ch)
}

// Backlogger is an outbox that can tell its backlog: how many entries wait
// to be relayed, and when the oldest of them was added (zero when none
// waits). idemsqlite's and idempg's outboxes are Backloggers.
type Backlogger interface {
	Backlog(ctx context.Context) (entries int, oldest time.Time, err error)
}

// OutboxConfig configures the outbox backlog gauges. The zero value is
// ready to use.
type OutboxConfig struct {
	// Timeout bounds the read of the backlog at each scrape. Defaults to
	// 5s.
	Timeout time.Duration
	// Clock tells the oldest entry's age. Defaults to idem.SystemClock.
	Clock idem.Clock
	// Logger receives the failures to read the backlog: the scrape then
	// goes on without the gauges. Defaults to a logger that discards.
	Logger *slog.Logger
}

type backlogCollector struct {
	ob           Backlogger
	cfg          OutboxConfig
	entries, age *prometheus.Desc
}

// NewOutboxCollector returns a collector of ob's backlog, read at each
// scrape: idem_outbox_backlog{outbox=name} (entries waiting to be
// relayed) and idem_outbox_oldest_age_seconds{outbox=name} (0 when none
// waits). cfg may be nil.
func NewOutboxCollector(name string, ob Backlogger, cfg *OutboxConfig) (prometheus.Collector, error) {
	if ob == nil {
		return nil, &idem.ArgumentError{Field: "idemprom outbox", Reason: "must not be nil"}
	}
	var c OutboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout < 0 {
		return nil, &idem.ArgumentError{Field: "idemprom.OutboxConfig.Timeout", Reason: "must not be negative"}
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	labels := prometheus.Labels{"outbox": name}
	return &backlogCollector{ob: ob, cfg: c,
		entries: prometheus.NewDesc("idem_outbox_backlog", "Outbox entries waiting to be relayed.", nil, labels),
		age: prometheus.NewDesc("idem_outbox_oldest_age_seconds",
			"Age of the oldest outbox entry waiting to be relayed; 0 when none waits.", nil, labels),
	}, nil
}

// RegisterOutbox registers ob's backlog gauges on reg under the label
// outbox=name. cfg may be nil.
func RegisterOutbox(reg prometheus.Registerer, name string, ob Backlogger, cfg *OutboxConfig) error {
	c, err := NewOutboxCollector(name, ob, cfg)
	if err != nil {
		return err
	}
	return reg.Register(c)
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.age
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	n, oldest, err := c.ob.Backlog(ctx)
	if err != nil {
		c.cfg.Logger.Warn("idemprom: reading the outbox backlog failed", "err", err)
		return
	}
	age := 0.0
	if n > 0 && !oldest.IsZero() {
		age = max(c.cfg.Clock.Now().Sub(oldest).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age)
}
