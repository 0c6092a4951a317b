package idemprom_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
)

// streamStats is a transport whose streams hold what its stats say.
type streamStats map[string]idem.StreamStats

func (s streamStats) StreamStats(consumer string) idem.StreamStats { return s[consumer] }

func TestStreamGauges(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	src := streamStats{"settlement": {
		Held: 40, HeldBytes: 8200, HeldPeak: 64, Delayed: 3, Limit: 64, Uncommitted: 5000,
		OldestHeld: clock.Now().Add(-90 * time.Second), CommitFailures: 2,
	}}
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterStream(reg, "settlement", src, clock); err != nil {
		t.Fatal(err)
	}
	if err := idemprom.RegisterStream(reg, "audit", src, clock); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP idem_stream_commit_failures_total Commits of a partition's position that failed; each is tried again by the next commit.
# TYPE idem_stream_commit_failures_total counter
idem_stream_commit_failures_total{consumer="audit"} 0
idem_stream_commit_failures_total{consumer="settlement"} 2
# HELP idem_stream_held_messages Messages the consumer's streams hold in memory: fetched ahead, handed out and not settled, or waiting for a redelivery.
# TYPE idem_stream_held_messages gauge
idem_stream_held_messages{consumer="audit"} 0
idem_stream_held_messages{consumer="settlement"} 40
# HELP idem_stream_oldest_held_age_seconds How long the message held longest by the consumer's streams has been held; 0 when none is.
# TYPE idem_stream_oldest_held_age_seconds gauge
idem_stream_oldest_held_age_seconds{consumer="audit"} 0
idem_stream_oldest_held_age_seconds{consumer="settlement"} 90
# HELP idem_stream_uncommitted_messages Messages fetched past the position last committed: what a crash would deliver again.
# TYPE idem_stream_uncommitted_messages gauge
idem_stream_uncommitted_messages{consumer="audit"} 0
idem_stream_uncommitted_messages{consumer="settlement"} 5000
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"idem_stream_commit_failures_total", "idem_stream_held_messages", "idem_stream_oldest_held_age_seconds", "idem_stream_uncommitted_messages"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 16 {
		t.Fatalf("%d series (%v), want 8 for each consumer", n, err)
	}
}

// A transport that tells what its streams hold (idemkafka's Transport
// does) gets gauges per consumer: a keyed message stuck at the head of its
// partition shows as messages uncommitted behind it, and as the age of the
// oldest held.
func ExampleRegisterStream() {
	clock := idemmem.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	transport := streamStats{"settlement": {Held: 1, HeldBytes: 210, Limit: 800, Uncommitted: 12000, OldestHeld: clock.Now().Add(-5 * time.Minute)}}
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterStream(reg, "settlement", transport, clock); err != nil {
		panic(err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if n := mf.GetName(); n == "idem_stream_uncommitted_messages" || n == "idem_stream_oldest_held_age_seconds" {
			fmt.Println(n, mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output:
	// idem_stream_oldest_held_age_seconds 300
	// idem_stream_uncommitted_messages 12000
}
