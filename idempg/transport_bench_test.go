package idempg_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// BenchmarkTransportPublish measures Publish of one message on its own (one
// round trip, a durable commit), from 4×GOMAXPROCS goroutines, to a topic with one
// consumer name, on the database's clock:
//
//	go test -run '^$' -bench TransportPublish -benchtime 5000x ./idempg/
func BenchmarkTransportPublish(b *testing.B) {
	ctx := b.Context()
	tr := newTransport(b, transportDB(b), idempg.TransportConfig{})
	subscribe(b, tr, idem.Subscription{Topic: "payments", Consumer: "settlement"})
	var n atomic.Int64
	b.SetParallelism(4) // 4×GOMAXPROCS goroutines; the DB has 8 connections
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if err := tr.Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments", Payload: []byte(`{"amount":1250}`)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTransportTakeAck measures how fast 4 competing streams of one
// consumer name take and acknowledge b.N messages published beforehand
// (in batches of 500), and reports msgs/s:
//
//	go test -run '^$' -bench TransportTakeAck -benchtime 20000x ./idempg/
func BenchmarkTransportTakeAck(b *testing.B) {
	ctx := b.Context()
	tr := newTransport(b, transportDB(b), idempg.TransportConfig{})
	sub := idem.Subscription{Topic: "payments", Consumer: "settlement", AckWait: time.Minute}
	const streams, batch = 4, 500
	var ss []idem.Stream
	for range streams {
		ss = append(ss, subscribe(b, tr, sub))
	}
	for i := 0; i < b.N; i += batch {
		var msgs []idem.Message
		for j := i; j < min(i+batch, b.N); j++ {
			msgs = append(msgs, idem.Message{ID: fmt.Sprint("m-", j), Topic: "payments", Payload: []byte(`{"amount":1250}`)})
		}
		if err := tr.Publish(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	start := time.Now()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() {
			for left.Load() > 0 {
				nctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				d, err := s.Next(nctx)
				cancel()
				if err != nil {
					continue
				}
				if err := d.Ack(ctx); err != nil {
					b.Error(err)
					return
				}
				left.Add(-1)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
