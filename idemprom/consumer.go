package idemprom

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/consumer"
)

const consumerMessagesHelp = "Messages handled by the consumer since the process started, by outcome: processed, duplicate, retried, dead_lettered, parked, stale."

// consumerCollector reads the consumer's Stats at scrape time.
type consumerCollector struct {
	desc *prometheus.Desc
	c    *consumer.Consumer
}

func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.c.Stats()
	for _, o := range []struct {
		outcome consumer.Outcome
		n       int64
	}{
		{consumer.OutcomeProcessed, s.Processed},
		{consumer.OutcomeDuplicate, s.Duplicates},
		{consumer.OutcomeRetried, s.Retried},
		{consumer.OutcomeDeadLettered, s.DeadLettered},
		{consumer.OutcomeParked, s.Parked},
		{consumer.OutcomeStale, s.Stale},
	} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(o.n), string(o.outcome))
	}
}

// NewConsumerCollector returns a collector of c's counts,
// idem_consumer_messages_total{consumer=name, outcome}, read from
// Consumer.Stats at each scrape.
func NewConsumerCollector(name string, c *consumer.Consumer) prometheus.Collector {
	desc := prometheus.NewDesc("idem_consumer_messages_total", consumerMessagesHelp,
		[]string{"outcome"}, prometheus.Labels{"consumer": name})
	return &consumerCollector{desc: desc, c: c}
}

// RegisterConsumer registers c's counts on reg under the label
// consumer=name (the consumer's Config.Name, as a rule).
func RegisterConsumer(reg prometheus.Registerer, name string, c *consumer.Consumer) error {
	return reg.Register(NewConsumerCollector(name, c))
}

// lagBuckets span a millisecond to some nine minutes: a message applied
// at once, and one that waited out a broker's outage.
var lagBuckets = prometheus.ExponentialBuckets(0.001, 2, 20)

// ConsumerObserver is a consumer.Observer that keeps latency histograms,
// and the prometheus.Collector that exports them:
//
//   - idem_consumer_process_duration_seconds{consumer, outcome}: from a
//     worker taking a delivery up to its outcome (the handler, the inbox's
//     transaction, a dead letter's writes);
//   - idem_consumer_lag_seconds{consumer}: from a message's publication
//     (Message.Time) to its commit, for messages processed: the
//     end-to-end lag.
//
// Give it to consumer.Config.Observer and register it.
type ConsumerObserver struct {
	process, lag *prometheus.HistogramVec
	outcome      map[consumer.Outcome]prometheus.Observer
	lagged       prometheus.Observer
}

var _ consumer.Observer = (*ConsumerObserver)(nil)

// NewConsumerObserver returns the histograms of the consumer it is given
// to, labelled consumer=name.
func NewConsumerObserver(name string) *ConsumerObserver {
	labels := prometheus.Labels{"consumer": name}
	o := &ConsumerObserver{
		process: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idem_consumer_process_duration_seconds", ConstLabels: labels, Buckets: latencyBuckets,
			Help: "Time from a worker taking a delivery up to its outcome, by outcome.",
		}, []string{"outcome"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idem_consumer_lag_seconds", ConstLabels: labels, Buckets: lagBuckets,
			Help: "End-to-end lag of the messages processed: from publication (the message's time) to the commit of their effect.",
		}, nil),
		outcome: make(map[consumer.Outcome]prometheus.Observer, len(consumer.Outcomes)),
	}
	for _, out := range consumer.Outcomes {
		o.outcome[out] = o.process.WithLabelValues(string(out))
	}
	o.lagged = o.lag.WithLabelValues()
	return o
}

// Begin implements consumer.Observer; it carries nothing.
func (o *ConsumerObserver) Begin(ctx context.Context, _ consumer.Event) context.Context { return ctx }

// End implements consumer.Observer.
func (o *ConsumerObserver) End(_ context.Context, e consumer.Event) {
	if h, ok := o.outcome[e.Outcome]; ok {
		h.Observe(e.Duration.Seconds())
	}
	if e.Outcome == consumer.OutcomeProcessed && !e.Message.Time.IsZero() {
		o.lagged.Observe(e.Lag.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (o *ConsumerObserver) Describe(ch chan<- *prometheus.Desc) {
	o.process.Describe(ch)
	o.lag.Describe(ch)
}

// Collect implements prometheus.Collector.
func (o *ConsumerObserver) Collect(ch chan<- prometheus.Metric) {
	o.process.Collect(ch)
	o.lag.Collect(ch)
}
