package idemprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
)

// StreamStatser is a transport that tells what the streams of a consumer
// hold in the process's memory (idem.StreamStats): idemkafka's Transport
// is one.
type StreamStatser interface {
	StreamStats(consumer string) idem.StreamStats
}

// streamCollector reads a transport's StreamStats at scrape time.
type streamCollector struct {
	consumer                                       string
	src                                            StreamStatser
	held, bytes, peak, delayed, limit, uncommitted *prometheus.Desc
	oldest, commitFailures                         *prometheus.Desc
	clock                                          idem.Clock
}

// NewStreamCollector returns a collector of what the streams of consumer
// (the consumer's Config.Name, its subscription's Consumer) hold, read
// from src at each scrape and labelled consumer=name:
//
//   - idem_stream_held_messages: messages held in memory (fetched ahead,
//     handed out and not settled, or waiting for a redelivery); it never
//     passes idem_stream_held_limit;
//   - idem_stream_held_bytes: their keys, payloads and headers;
//   - idem_stream_held_peak_messages: the most held at once;
//   - idem_stream_delayed_messages: those waiting for a Nack's delay;
//   - idem_stream_held_limit: the most that may be held (MaxInFlight);
//   - idem_stream_uncommitted_messages: fetched past the position last
//     committed, what a crash would deliver again: a message stuck at the
//     head of its partition makes it grow;
//   - idem_stream_oldest_held_age_seconds: how long the message held
//     longest has been held, 0 when none is;
//   - idem_stream_commit_failures_total: commits of a partition's position
//     that failed (each retried by the next).
//
// clock tells the age; nil means idem.SystemClock.
func NewStreamCollector(name string, src StreamStatser, clock idem.Clock) prometheus.Collector {
	if clock == nil {
		clock = idem.SystemClock{}
	}
	labels := prometheus.Labels{"consumer": name}
	d := func(metric, help string) *prometheus.Desc { return prometheus.NewDesc(metric, help, nil, labels) }
	return &streamCollector{
		consumer:    name,
		src:         src,
		clock:       clock,
		held:        d("idem_stream_held_messages", "Messages the consumer's streams hold in memory: fetched ahead, handed out and not settled, or waiting for a redelivery."),
		bytes:       d("idem_stream_held_bytes", "Bytes of the keys, payloads and headers of the messages the consumer's streams hold."),
		peak:        d("idem_stream_held_peak_messages", "The most messages the consumer's streams have held at once."),
		delayed:     d("idem_stream_delayed_messages", "Messages the consumer's streams hold for a Nack's delay."),
		limit:       d("idem_stream_held_limit", "The most messages the consumer's streams may hold (MaxInFlight)."),
		uncommitted: d("idem_stream_uncommitted_messages", "Messages fetched past the position last committed: what a crash would deliver again."),
		oldest:      d("idem_stream_oldest_held_age_seconds", "How long the message held longest by the consumer's streams has been held; 0 when none is."),
		commitFailures: prometheus.NewDesc("idem_stream_commit_failures_total",
			"Commits of a partition's position that failed; each is tried again by the next commit.", nil, labels),
	}
}

// RegisterStream registers the stream gauges of consumer name, read from
// src, on reg.
func RegisterStream(reg prometheus.Registerer, name string, src StreamStatser, clock idem.Clock) error {
	return reg.Register(NewStreamCollector(name, src, clock))
}

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.held, c.bytes, c.peak, c.delayed, c.limit, c.uncommitted, c.oldest, c.commitFailures} {
		ch <- d
	}
}

func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.StreamStats(c.consumer)
	age := 0.0
	if !s.OldestHeld.IsZero() {
		age = max(c.clock.Now().Sub(s.OldestHeld).Seconds(), 0)
	}
	for _, g := range []struct {
		d *prometheus.Desc
		v float64
	}{
		{c.held, float64(s.Held)}, {c.bytes, float64(s.HeldBytes)}, {c.peak, float64(s.HeldPeak)},
		{c.delayed, float64(s.Delayed)}, {c.limit, float64(s.Limit)}, {c.uncommitted, float64(s.Uncommitted)}, {c.oldest, age},
	} {
		ch <- prometheus.MustNewConstMetric(g.d, prometheus.GaugeValue, g.v)
	}
	ch <- prometheus.MustNewConstMetric(c.commitFailures, prometheus.CounterValue, float64(s.CommitFailures))
}
