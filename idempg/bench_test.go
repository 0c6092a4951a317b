package idempg_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// BenchmarkClaimDuringPurge measures what purging a million expired keys
// costs the claims that run meanwhile, against the same claims with no purge
// running, in one run on one database:
//
//  1. it loads 1,000,000 expired, completed keys (INSERT ... SELECT
//     generate_series) into a fresh schema, then VACUUM ANALYZE;
//  2. baseline: claimWorkers goroutines claim fresh keys for baselineFor;
//  3. purge: the same goroutines claim fresh keys while another goroutine
//     calls Purge(1000) until it returns less than 1000, that is until the
//     million rows are gone.
//
// It reports claim latency percentiles of both phases (base-p50-ms,
// base-p99-ms, purge-p50-ms, purge-p99-ms, and the maxima), the claims made
// in each and how many took over 100ms, the whole purge's duration (purge-s) and the latency of one
// Purge(1000) call (batch-p50-ms, batch-p99-ms). The default clock is the
// database's, as in production. Each iteration loads the million rows
// again, so run one:
//
//	go test -run '^$' -bench ClaimDuringPurge -benchtime 1x ./idempg/
func BenchmarkClaimDuringPurge(b *testing.B) {
	url := pgURL(b)
	const (
		expiredRows  = 1_000_000
		claimWorkers = 4
		batch        = 1000
		baselineFor  = 5 * time.Second
	)
	for range b.N {
		b.StopTimer()
		db := openDB(b, url, idempg.Config{MaxConns: claimWorkers + 2})
		s := newStore(b, db)
		ctx := b.Context()
		loadStart := time.Now()
		if _, err := db.Pool().Exec(ctx, `INSERT INTO idem_keys
			(scope, key, fingerprint, state, token, status, body, created_at, lease_expires_at, expires_at, completed_at)
			SELECT 'bench', 'expired-' || i, 'fp', 'completed', i, 200, '\x7b7d'::bytea,
				n.t - interval '2 hours', n.t - interval '2 hours' + interval '30 seconds',
				n.t - interval '1 hour' - i * interval '1 millisecond', n.t - interval '2 hours'
			FROM generate_series(1, $1::int) AS i, (SELECT clock_timestamp() AS t) AS n`, expiredRows); err != nil {
			b.Fatal(err)
		}
		if _, err := db.Pool().Exec(ctx, `VACUUM ANALYZE idem_keys`); err != nil {
			b.Fatal(err)
		}
		b.Logf("loaded %d expired keys in %v", expiredRows, time.Since(loadStart).Round(time.Millisecond))
		b.StartTimer()

		// claims runs the workers until stop is closed and returns every
		// claim's latency.
		claims := func(phase string, stop <-chan struct{}) []time.Duration {
			var (
				mu  sync.Mutex
				all []time.Duration
				wg  sync.WaitGroup
			)
			for w := range claimWorkers {
				wg.Go(func() {
					var mine []time.Duration
					for i := 0; ; i++ {
						select {
						case <-stop:
							mu.Lock()
							all = append(all, mine...)
							mu.Unlock()
							return
						default:
						}
						req := idem.ClaimRequest{Scope: "bench", Key: idem.Key(fmt.Sprintf("%s-%d-%d", phase, w, i)),
							Fingerprint: "fp", Lease: 30 * time.Second, TTL: time.Hour}
						start := time.Now()
						c, err := s.Claim(ctx, req)
						mine = append(mine, time.Since(start))
						if err != nil || c.Outcome != idem.Acquired {
							b.Errorf("Claim(%s) = %v, %v", req.Key, c.Outcome, err)
							return
						}
					}
				})
			}
			wg.Wait()
			return all
		}

		stop := make(chan struct{})
		time.AfterFunc(baselineFor, func() { close(stop) })
		base := claims("base", stop)

		stop = make(chan struct{})
		var (
			batches  []time.Duration
			purged   atomic.Int64
			purgeErr error
		)
		purgeStart := time.Now()
		go func() {
			defer close(stop)
			for {
				start := time.Now()
				n, err := s.Purge(ctx, batch)
				batches = append(batches, time.Since(start))
				if err != nil {
					purgeErr = err
					return
				}
				purged.Add(int64(n))
				if n < batch {
					return
				}
			}
		}()
		during := claims("purge", stop)
		purgeTook := time.Since(purgeStart)
		if purgeErr != nil {
			b.Fatal(purgeErr)
		}
		if got := purged.Load(); got != expiredRows {
			b.Fatalf("purged %d rows, want %d", got, expiredRows)
		}

		b.ReportMetric(pct(base, 50), "base-p50-ms")
		b.ReportMetric(pct(base, 99), "base-p99-ms")
		b.ReportMetric(pct(base, 99.9), "base-p99.9-ms")
		b.ReportMetric(pct(base, 100), "base-max-ms")
		b.ReportMetric(float64(len(base)), "base-claims")
		b.ReportMetric(float64(over(base, 100*time.Millisecond)), "base-over100ms")
		b.ReportMetric(pct(during, 50), "purge-p50-ms")
		b.ReportMetric(pct(during, 99), "purge-p99-ms")
		b.ReportMetric(pct(during, 99.9), "purge-p99.9-ms")
		b.ReportMetric(pct(during, 100), "purge-max-ms")
		b.ReportMetric(float64(len(during)), "purge-claims")
		b.ReportMetric(float64(over(during, 100*time.Millisecond)), "purge-over100ms")
		b.ReportMetric(purgeTook.Seconds(), "purge-s")
		b.ReportMetric(pct(batches, 50), "batch-p50-ms")
		b.ReportMetric(pct(batches, 99), "batch-p99-ms")
	}
}

// pct returns the p-th percentile of ds in milliseconds (100 is the maximum).
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, int(float64(len(s))*p/100))
	return float64(s[i]) / float64(time.Millisecond)
}

// over counts the durations longer than d.
func over(ds []time.Duration, d time.Duration) int {
	n := 0
	for _, x := range ds {
		if x > d {
			n++
		}
	}
	return n
}
