package idemprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/outbox"
)

// failingLetters is dead letters whose Stats fails.
type failingLetters struct{ idem.DeadLetters }

func (failingLetters) Stats(context.Context) ([]idem.DeadLetterStats, error) {
	return nil, errors.New("database is locked")
}

func TestDeadLettersGauges(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	letters := idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock})
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterDeadLetters(reg, letters, &idemprom.DeadLettersConfig{Consumers: []string{"settlement", "audit"}, Clock: clock}); err != nil {
		t.Fatal(err)
	}
	at := clock.Now()
	if _, err := letters.Add(t.Context(), idem.DeadLetter{Consumer: "audit", Message: idem.Message{ID: "m", Topic: "t"},
		Class: idem.DeadPermanent, Attempts: []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: "x"}},
		FirstFailedAt: at, LastFailedAt: at}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(90 * time.Second)
	want := `
# HELP idem_dead_letter_oldest_age_seconds Age of the oldest waiting dead letter (since its first failure), per consumer.
# TYPE idem_dead_letter_oldest_age_seconds gauge
idem_dead_letter_oldest_age_seconds{consumer="audit"} 90
idem_dead_letter_oldest_age_seconds{consumer="settlement"} 0
# HELP idem_dead_letters Dead letters waiting for a person (state dead), per consumer.
# TYPE idem_dead_letters gauge
idem_dead_letters{consumer="audit"} 1
idem_dead_letters{consumer="settlement"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}

	// A store that fails leaves the gauges out rather than fail the scrape.
	broken := prometheus.NewRegistry()
	if err := idemprom.RegisterDeadLetters(broken, failingLetters{letters}, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(broken); err != nil || n != 0 {
		t.Fatalf("with Stats failing: %d series, %v; want none and no error", n, err)
	}
	for _, bad := range []struct {
		dl  idem.DeadLetters
		cfg *idemprom.DeadLettersConfig
	}{{nil, nil}, {letters, &idemprom.DeadLettersConfig{Timeout: -time.Second}}} {
		if err := idemprom.RegisterDeadLetters(prometheus.NewRegistry(), bad.dl, bad.cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("RegisterDeadLetters(%v, %+v) = %v, want an invalid argument", bad.dl, bad.cfg, err)
		}
	}
}

func TestRelayObserverCountsFailures(t *testing.T) {
	t.Parallel()
	o := idemprom.NewRelayObserver("orders")
	start := time.Now()
	o.Pass(t.Context(), outbox.Pass{Start: start, Duration: time.Millisecond, Sent: 3, Oldest: start.Add(-time.Second)})
	o.Pass(t.Context(), outbox.Pass{Start: start, Duration: time.Millisecond, Err: errors.New("broker down")})
	want := `
# HELP idem_outbox_pass_failures_total Relay passes that failed; the relay keeps the batch and tries again after its backoff.
# TYPE idem_outbox_pass_failures_total counter
idem_outbox_pass_failures_total{relay="orders"} 1
# HELP idem_outbox_relayed_total Outbox entries the relay published (or had moved) and marked sent.
# TYPE idem_outbox_relayed_total counter
idem_outbox_relayed_total{relay="orders"} 3
`
	if err := testutil.CollectAndCompare(o, strings.NewReader(want), "idem_outbox_pass_failures_total", "idem_outbox_relayed_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(o, "idem_outbox_relay_delay_seconds"); n != 1 {
		t.Fatalf("%d delay series, want 1", n)
	}
}
