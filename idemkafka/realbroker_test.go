package idemkafka_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemtest"
)

// kafkaURLEnv names a real Kafka (or Redpanda) to run the suites against
// too, as kafka://HOST:PORT[,HOST:PORT]. No such broker can be installed on
// the project's machines, so these tests skip when it is unset, even under
// IDEM_REQUIRE_SERVICES=1: everything else runs against kfake.
const kafkaURLEnv = "IDEM_KAFKA_URL"

func realKafka(t *testing.T) []string {
	t.Helper()
	raw := os.Getenv(kafkaURLEnv)
	if raw == "" {
		t.Skipf("skipping: %s names no Kafka broker (the kfake tests cover the transport)", kafkaURLEnv)
	}
	seeds, err := idemkafka.ParseURL(raw)
	if err != nil {
		t.Fatalf("%s: %v", kafkaURLEnv, err)
	}
	return seeds
}

func TestRealBrokerTransport(t *testing.T) {
	t.Parallel()
	seeds := realKafka(t)
	idemtest.TestTransport(t, features, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
		tr := open(t, seeds, idemkafka.Config{Clock: clock, Partitions: 1})
		return tr, tr
	})
}

func TestRealBrokerPerKeyOrder(t *testing.T) {
	t.Parallel()
	seeds := realKafka(t)
	tr := open(t, seeds, idemkafka.Config{})
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{
		CopiesDelivered: true,
		// A topic of the run's own: the broker keeps what earlier runs
		// left in payments.succeeded.
		Topic: fmt.Sprintf("idemtest.%08x.order", rand.Uint32()),
		Wait:  2 * time.Minute,
	})
}

// The settings a broker's topics have are read back: on kfake (one
// broker, no replication) the replication factor is reported, and a
// retention shorter than the retry horizon is.
func TestWarnings(t *testing.T) {
	t.Parallel()
	seeds := startKafka(t)
	tr := open(t, seeds, idemkafka.Config{RetryHorizon: 48 * time.Hour})
	ctx := t.Context()
	if err := tr.Publish(ctx, idem.Message{ID: "1", Topic: "short"}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if _, err := tr.Warnings(ctx, "missing"); err == nil {
		t.Error("Warnings of a topic that does not exist = nil error")
	}
	ws, err := tr.Warnings(ctx, "short")
	if err != nil {
		t.Fatalf("Warnings: %v", err)
	}
	got := map[string]string{}
	for _, w := range ws {
		got[w.Setting] = w.Value
	}
	if got["replication.factor"] != "1" {
		t.Errorf("warnings %v, want replication.factor 1 among them", got)
	}
	if _, ok := got["retention.ms"]; ok {
		t.Errorf("warnings %v: the default retention (7 days) is longer than the horizon", got)
	}
	// A day's retention is shorter than the 48h horizon.
	if err := alterRetention(ctx, seeds, "short", "86400000"); err != nil {
		t.Fatalf("setting retention.ms: %v", err)
	}
	ws, err = tr.Warnings(ctx, "short")
	if err != nil {
		t.Fatalf("Warnings: %v", err)
	}
	found := false
	for _, w := range ws {
		if w.Setting == "retention.ms" && w.Value == "86400000" {
			found = true
		}
	}
	if !found {
		t.Errorf("warnings %v after retention.ms=86400000, want it reported", ws)
	}
}

// Kafka deletes records by size as it does by age, consumed or not, and a
// compacted topic drops a key's older records once a newer one is written:
// either loses a message waiting behind its parked key, for its retry or
// for a stopped consumer. Both are reported; Kafka's defaults (delete,
// retention.bytes -1) are not.
func TestWarningsOfDeletionBySizeAndCompaction(t *testing.T) {
	t.Parallel()
	seeds := startKafka(t)
	tr := open(t, seeds, idemkafka.Config{})
	ctx := t.Context()
	if err := tr.EnsureTopics(ctx, "orders"); err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	settings := func() map[string]string {
		t.Helper()
		ws, err := tr.Warnings(ctx, "orders")
		if err != nil {
			t.Fatalf("Warnings: %v", err)
		}
		got := map[string]string{}
		for _, w := range ws {
			got[w.Setting] = w.Value
		}
		return got
	}
	got := settings()
	for _, s := range []string{"cleanup.policy", "retention.bytes"} {
		if v, ok := got[s]; ok {
			t.Errorf("Kafka's default %s=%s reported", s, v)
		}
	}
	for _, s := range [][2]string{{"cleanup.policy", "compact"}, {"retention.bytes", "1048576"}} {
		if err := alterTopic(ctx, seeds, "orders", s[0], s[1]); err != nil {
			t.Fatalf("setting %s: %v", s[0], err)
		}
	}
	got = settings()
	if got["cleanup.policy"] != "compact" || got["retention.bytes"] != "1048576" {
		t.Errorf("warnings %v after cleanup.policy=compact and retention.bytes=1048576, want both reported", got)
	}
	if err := alterTopic(ctx, seeds, "orders", "cleanup.policy", "compact,delete"); err != nil {
		t.Fatalf("setting cleanup.policy: %v", err)
	}
	if got := settings(); got["cleanup.policy"] != "compact,delete" {
		t.Errorf("warnings %v after cleanup.policy=compact,delete, want it reported", got)
	}
}
