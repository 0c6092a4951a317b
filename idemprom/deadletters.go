package idemprom

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
)

var (
	deadLettersDesc = prometheus.NewDesc("idem_dead_letters",
		"Dead letters waiting for a person (state dead), per consumer.", []string{"consumer"}, nil)
	deadLetterAgeDesc = prometheus.NewDesc("idem_dead_letter_oldest_age_seconds",
		"Age of the oldest waiting dead letter (since its first failure), per consumer.", []string{"consumer"}, nil)
)

// DeadLettersConfig configures the dead-letter gauges. The zero value is
// ready to use.
type DeadLettersConfig struct {
	// Consumers are exported with an explicit zero while they have no
	// dead letter, so that an alert on the gauge has a series to look at
	// before the first letter. Defaults to none: only consumers with dead
	// letters have series.
	Consumers []string
	// Timeout bounds the read of DeadLetters.Stats at each scrape.
	// Defaults to 5s.
	Timeout time.Duration
	// Clock tells the letters' age. Defaults to idem.SystemClock.
	Clock idem.Clock
	// Logger receives the failures to read the stats: the scrape then
	// goes on without the gauges, so that the other metrics are still
	// collected (an absent gauge is what alerts on an unreadable store look
	// for). Defaults to a logger that discards.
	Logger *slog.Logger
}

// deadLettersCollector reads the dead letters' stats at each scrape.
type deadLettersCollector struct {
	dl  idem.DeadLetters
	cfg DeadLettersConfig
}

// NewDeadLettersCollector returns a collector of dl's gauges,
// idem_dead_letters{consumer} and
// idem_dead_letter_oldest_age_seconds{consumer}, read from
// DeadLetters.Stats at each scrape. cfg may be nil.
func NewDeadLettersCollector(dl idem.DeadLetters, cfg *DeadLettersConfig) (prometheus.Collector, error) {
	if dl == nil {
		return nil, &idem.ArgumentError{Field: "idemprom dead letters", Reason: "must not be nil"}
	}
	var c DeadLettersConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout < 0 {
		return nil, &idem.ArgumentError{Field: "idemprom.DeadLettersConfig.Timeout", Reason: "must not be negative"}
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
	c.Consumers = append([]string(nil), c.Consumers...)
	return &deadLettersCollector{dl: dl, cfg: c}, nil
}

// RegisterDeadLetters registers dl's gauges on reg. cfg may be nil.
func RegisterDeadLetters(reg prometheus.Registerer, dl idem.DeadLetters, cfg *DeadLettersConfig) error {
	c, err := NewDeadLettersCollector(dl, cfg)
	if err != nil {
		return err
	}
	return reg.Register(c)
}

func (c *deadLettersCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- deadLettersDesc
	ch <- deadLetterAgeDesc
}

func (c *deadLettersCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	stats, err := c.dl.Stats(ctx)
	if err != nil {
		c.cfg.Logger.Warn("idemprom: reading dead-letter stats failed", "err", err)
		return
	}
	now := c.cfg.Clock.Now()
	seen := make(map[string]bool, len(stats))
	for _, st := range stats {
		seen[st.Consumer] = true
		ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, float64(st.Count), st.Consumer)
		ch <- prometheus.MustNewConstMetric(deadLetterAgeDesc, prometheus.GaugeValue, max(now.Sub(st.Oldest).Seconds(), 0), st.Consumer)
	}
	for _, name := range c.cfg.Consumers {
		if !seen[name] {
			seen[name] = true
			ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, 0, name)
			ch <- prometheus.MustNewConstMetric(deadLetterAgeDesc, prometheus.GaugeValue, 0, name)
		}
	}
}
