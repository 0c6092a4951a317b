package bench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/bench"
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
	cs, err := bench.Run(ctx, &bench.Options{PostgresURL: pg, RedisURL: rd, Requests: 100, Rounds: 1, Concurrency: 4, Out: &progress})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	want := []string{"redis first", "redis replay", "postgres first", "postgres replay"}
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
	if !strings.Contains(table.String(), "ratio") || strings.Count(table.String(), "\n") != 5 {
		t.Errorf("table:\n%s", table.String())
	}
}

func TestRunNeedsAStore(t *testing.T) {
	if _, err := bench.Run(context.Background(), nil); err == nil {
		t.Fatal("Run with no store succeeded")
	}
}
