package bench_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/cmd/idem/internal/bench"
	"github.com/idem-go/idem/idemtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun runs a small measurement against the real stores: it checks the
// harness works end to end (both sides succeed, figures are filled in), not
// how fast anything is; speed is for `idem bench` to report.
func TestRun(t *testing.T) {
	pg := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	rd := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	cs, err := bench.Run(ctx, &bench.Options{PostgresURL: pg, RedisURL: rd, SQLite: true, Requests: 100, Rounds: 1, Concurrency: 4, SlowHandler: time.Millisecond, Out: &progress})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	want := []string{"redis first", "redis replay", "postgres first", "postgres replay", "postgres slow", "sqlite first", "sqlite replay", "sqlite slow"}
	if len(cs) != len(want) {
		t.Fatalf("%d comparisons, want %d", len(cs), len(want))
	}
	for i, c := range cs {
		if got := c.Store + " " + c.Case; got != want[i] {
			t.Errorf("comparison %d is %q, want %q", i, got, want[i])
		}
		if c.Middleware.PerSecond <= 0 || c.Minimum.PerSecond <= 0 || c.Ratio <= 0 || c.Middleware.P99 < c.Middleware.P50 {
			t.Errorf("%s %s: figures not filled in: %+v", c.Store, c.Case, c)
		}
	}
	var table bytes.Buffer
	bench.Print(&table, cs)
	if !strings.Contains(table.String(), "ratio") || strings.Count(table.String(), "\n") != 9 {
		t.Errorf("table:\n%s", table.String())
	}
}

// With no URL, SQLite alone is measured, on a temporary file.
func TestRunSQLiteAlone(t *testing.T) {
	var results bytes.Buffer
	cs, err := bench.Run(context.Background(), &bench.Options{Requests: 50, Rounds: 1, Concurrency: 2, SlowHandler: time.Millisecond, Results: &results})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 3 || cs[0].Store != "sqlite" || cs[0].Case != "first" || cs[1].Case != "replay" || cs[2].Case != "slow" {
		t.Fatalf("comparisons %+v, want sqlite first, replay and slow", cs)
	}
	for _, name := range []string{"idem-http-sqlite-slow", "minimum-http-sqlite-slow"} {
		if !strings.Contains(results.String(), "RESULT,"+name+",round_ms,") {
			t.Errorf("no RESULT line for %s round_ms:\n%s", name, results.String())
		}
	}
	for _, name := range []string{"idem-http-sqlite-first", "minimum-http-sqlite-first", "idem-http-sqlite-replay", "minimum-http-sqlite-replay"} {
		for _, metric := range []string{"req_per_s", "p99_ms"} {
			if !strings.Contains(results.String(), "RESULT,"+name+","+metric+",") {
				t.Errorf("no RESULT line for %s %s:\n%s", name, metric, results.String())
			}
		}
	}
}

// TestMessages runs every message measurement once, small, against the
// real services: the harness works end to end and every figure is filled
// in (and each measurement checked its own counts); speed is for `idem
// bench messages` to report.
func TestMessages(t *testing.T) {
	pg := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	nats := idemtest.RequireService(t, "NATS", "IDEM_NATS_URL", "nats://127.0.0.1:4222")
	amqp := idemtest.RequireService(t, "RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	// Kafka is kfake, in the test's process: none can be installed here.
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress, results bytes.Buffer
	fs, err := bench.Messages(ctx, &bench.MessagesOptions{
		PostgresURL: pg, NATSURL: nats, AMQPURL: amqp, KafkaSeeds: kafka.ListenAddrs(), Dir: t.TempDir(),
		Messages: 400, Keys: 10, Rounds: 1, Out: &progress, Results: &results,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var names []string
	for _, f := range fs {
		names = append(names, f.Name+" "+f.Metric)
		if len(f.Values) != 1 || f.Median() <= 0 {
			t.Errorf("%s %s: values %v", f.Name, f.Metric, f.Values)
		}
	}
	for _, want := range []string{
		"idem-consumer-pg msgs_per_s", "minimum-consumer-pg msgs_per_s", "idem-consumer-batch-pg msgs_per_s",
		"idem-transport-pg take_ack_per_s", "idem-relay-pg publish_per_s", "idem-pipeline-pg settled_per_s",
		"idem-consumer-sqlite msgs_per_s", "minimum-consumer-sqlite msgs_per_s", "idem-pipeline-sqlite settled_per_s",
		"idem-consumer-nats msgs_per_s", "minimum-consumer-nats msgs_per_s", "idem-transport-nats take_ack_per_s",
		"idem-consumer-amqp msgs_per_s", "minimum-consumer-amqp msgs_per_s", "idem-transport-amqp take_ack_per_s",
		"idem-consumer-kafka msgs_per_s", "idem-publish-kafka publish_per_s", "minimum-consumer-kafka msgs_per_s",
		"idem-transport-kafka take_ack_per_s",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no figure %q among %v", want, names)
		}
	}
	if lines := strings.Count(results.String(), "RESULT,"); lines != len(fs) {
		t.Errorf("%d RESULT lines for %d figures:\n%s", lines, len(fs), results.String())
	}
	var table bytes.Buffer
	bench.PrintFigures(&table, fs)
	if !strings.Contains(table.String(), "idem-consumer-pg / minimum-consumer-pg") {
		t.Errorf("the table has no ratio of the consumer to its minimum:\n%s", table.String())
	}
}
