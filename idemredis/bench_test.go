package idemredis_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
)

const (
	benchLease = 30 * time.Second
	benchTTL   = time.Minute
	// benchConcurrency is how many requests are in flight at once.
	benchConcurrency = 4
)

var benchResponse = idem.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"pay_0123456789","amount":1250,"currency":"EUR","status":"succeeded"}`),
}

// BenchmarkClaimComplete compares, in one run on one Redis, a first
// execution through the Store (Claim, then Complete with the response)
// against the hand-written minimum for the same guarantee of "at most one
// claimant": one SET NX PX to claim the key and one SET to keep the
// response. Both make two round trips per key; the difference is what the
// Store's scripts do on the server (fencing token, lease, fingerprint,
// TTL, change notification) and the encoding on the client.
//
// The two run in alternating batches, so that a machine whose load changes
// during the run slows both alike. Reported: ns per key for each
// (store-ns/op, minimum-ns/op) and store/minimum throughput (x-minimum).
//
//	go test -run '^$' -bench . -benchtime 20000x ./idemredis/
func BenchmarkClaimComplete(b *testing.B) {
	client := newClient(b)
	prefix := randomPrefix(b)
	s := newStore(b, client, &idemredis.Config{Prefix: prefix})
	ctx := context.Background()
	var seq atomic.Int64
	compare(b,
		func() error {
			key := idem.Key("k" + strconv.FormatInt(seq.Add(1), 10))
			c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "bench", Key: key, Fingerprint: "fp", Lease: benchLease, TTL: benchTTL})
			if err != nil {
				return err
			}
			if c.Outcome != idem.Acquired {
				return fmt.Errorf("Claim = %v", c.Outcome)
			}
			return s.Complete(ctx, idem.Ref{Scope: "bench", Key: key, Token: c.Token}, benchResponse)
		},
		func() error {
			key := prefix + ":min:" + strconv.FormatInt(seq.Add(1), 10)
			ok, err := client.SetNX(ctx, key, "fp", benchLease).Result()
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("SET NX found %s", key)
			}
			return client.Set(ctx, key, benchResponse.Body, benchTTL).Err()
		})
}

// BenchmarkReplay compares a duplicate's Claim of a completed key (which
// returns the stored response) with the minimum: one GET.
func BenchmarkReplay(b *testing.B) {
	client := newClient(b)
	prefix := randomPrefix(b)
	s := newStore(b, client, &idemredis.Config{Prefix: prefix})
	ctx := context.Background()
	req := idem.ClaimRequest{Scope: "bench", Key: "k", Fingerprint: "fp", Lease: benchLease, TTL: benchTTL}
	c, err := s.Claim(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, idem.Ref{Scope: "bench", Key: "k", Token: c.Token}, benchResponse); err != nil {
		b.Fatal(err)
	}
	minKey := prefix + ":min"
	if err := client.Set(ctx, minKey, benchResponse.Body, benchTTL).Err(); err != nil {
		b.Fatal(err)
	}
	compare(b,
		func() error {
			c, err := s.Claim(ctx, req)
			if err == nil && c.Outcome != idem.Completed {
				err = fmt.Errorf("Claim = %v", c.Outcome)
			}
			return err
		},
		func() error { return client.Get(ctx, minKey).Err() })
}

// BenchmarkClients compares the Store on go-redis (NewStore) and on rueidis
// (NewRueidisStore, Open) side by side, in alternating batches on one Redis,
// with 4, 16 and 64 goroutines: first executions (Claim of a new key, then
// Complete) and replays (Claim of a completed key). The go-redis client's
// pool has a connection per goroutine; rueidis pipelines all of them on
// its own. Reported: ns per operation for each and rueidis/go-redis
// throughput (x-go-redis).
//
//	go test -run '^$' -bench Clients -benchtime 20000x ./idemredis/
func BenchmarkClients(b *testing.B) {
	for _, conc := range []int{4, 16, 64} {
		goredis := newClient(b, func(o *redis.Options) { o.PoolSize = conc + 2 })
		prefix := randomPrefix(b)
		gs := newStore(b, goredis, &idemredis.Config{Prefix: prefix})
		rs, err := idemredis.NewRueidisStore(b.Context(), newRueidisClient(b), &idemredis.Config{Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rs.Close() })
		ctx := context.Background()
		var seq atomic.Int64
		first := func(s *idemredis.Store) func() error {
			return func() error {
				key := idem.Key("k" + strconv.FormatInt(seq.Add(1), 10))
				c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "bench", Key: key, Fingerprint: "fp", Lease: benchLease, TTL: benchTTL})
				if err != nil {
					return err
				}
				if c.Outcome != idem.Acquired {
					return fmt.Errorf("Claim = %v", c.Outcome)
				}
				return s.Complete(ctx, idem.Ref{Scope: "bench", Key: key, Token: c.Token}, benchResponse)
			}
		}
		req := idem.ClaimRequest{Scope: "bench", Key: "replayed", Fingerprint: "fp", Lease: benchLease, TTL: benchTTL}
		c, err := gs.Claim(ctx, req)
		if err == nil {
			err = gs.Complete(ctx, idem.Ref{Scope: "bench", Key: "replayed", Token: c.Token}, benchResponse)
		}
		if err != nil {
			b.Fatal(err)
		}
		replay := func(s *idemredis.Store) func() error {
			return func() error {
				c, err := s.Claim(ctx, req)
				if err == nil && c.Outcome != idem.Completed {
					err = fmt.Errorf("Claim = %v", c.Outcome)
				}
				return err
			}
		}
		b.Run(fmt.Sprintf("first/%d", conc), func(b *testing.B) {
			compareN(b, conc, "rueidis", first(rs), "go-redis", first(gs))
		})
		b.Run(fmt.Sprintf("replay/%d", conc), func(b *testing.B) {
			compareN(b, conc, "rueidis", replay(rs), "go-redis", replay(gs))
		})
	}
}

// compare runs b.N calls of store and b.N of minimum, each from
// benchConcurrency goroutines, alternating in batches, and reports the time
// per call of each and their throughput ratio.
func compare(b *testing.B, store, minimum func() error) {
	compareN(b, benchConcurrency, "store", store, "minimum", minimum)
}

// compareN runs b.N calls of a and b.N of base, each from conc goroutines,
// alternating in batches, and reports the time per call of each
// (<name>-ns/op) and a's throughput relative to base's (x-<base>).
func compareN(b *testing.B, conc int, aName string, a func() error, baseName string, base func() error) {
	const batch = 500
	var aTime, baseTime time.Duration
	run := func(n int, op func() error) time.Duration {
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					if err := op(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		n := min(batch, b.N-done)
		aTime += run(n, a)
		baseTime += run(n, base)
	}
	b.StopTimer()
	aNs := float64(aTime.Nanoseconds()) / float64(b.N)
	baseNs := float64(baseTime.Nanoseconds()) / float64(b.N)
	b.ReportMetric(aNs, aName+"-ns/op")
	b.ReportMetric(baseNs, baseName+"-ns/op")
	b.ReportMetric(baseNs/aNs, "x-"+baseName)
}
