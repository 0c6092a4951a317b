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

// compare runs b.N calls of store and b.N of minimum, each from
// benchConcurrency goroutines, alternating in batches, and reports the time
// per call of each and their throughput ratio.
func compare(b *testing.B, store, minimum func() error) {
	const batch = 500
	var storeTime, minTime time.Duration
	run := func(n int, op func() error) time.Duration {
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range benchConcurrency {
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
		storeTime += run(n, store)
		minTime += run(n, minimum)
	}
	b.StopTimer()
	storeNs := float64(storeTime.Nanoseconds()) / float64(b.N)
	minNs := float64(minTime.Nanoseconds()) / float64(b.N)
	b.ReportMetric(storeNs, "store-ns/op")
	b.ReportMetric(minNs, "minimum-ns/op")
	b.ReportMetric(minNs/storeNs, "x-minimum")
}
