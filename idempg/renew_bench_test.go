package idempg_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// BenchmarkHeartbeat compares the two ways a consumer's heartbeat can renew
// the AckWait of the 800 deliveries it holds (MaxPending's default):
//
//   - one-at-a-time: an InProgress each, a round trip each, as a stream
//     that is not an idem.BatchRenewer is renewed;
//   - batch: one InProgressBatch of the 800, one statement.
//
// Each op is one beat of the 800; each reports ms/beat. A beat must take
// far less than a quarter of the AckWait, the interval the heartbeat keeps:
//
//	go test -run '^$' -bench Heartbeat -count 2 ./idempg/
func BenchmarkHeartbeat(b *testing.B) {
	for _, mode := range []string{"one-at-a-time", "batch"} {
		b.Run(mode, func(b *testing.B) { benchHeartbeat(b, mode) })
	}
}

func benchHeartbeat(b *testing.B, mode string) {
	const held = 800
	ctx := b.Context()
	tr := newTransport(b, transportDB(b), idempg.TransportConfig{})
	s := subscribe(b, tr, idem.Subscription{Topic: benchTopic, Consumer: "settlement", AckWait: time.Hour, MaxInFlight: held})
	msgs := make([]idem.Message, held)
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprint("evt-", i), Topic: benchTopic}
	}
	if err := tr.Publish(ctx, msgs...); err != nil {
		b.Fatal(err)
	}
	bs := s.(idem.BatchStream)
	var ds []idem.Delivery
	for len(ds) < held {
		got, err := bs.NextBatch(ctx, held-len(ds))
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, got...)
	}
	r := s.(idem.BatchRenewer)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		switch mode {
		case "batch":
			stale, err := r.InProgressBatch(ctx, ds)
			if err != nil || len(stale) != 0 {
				b.Fatalf("InProgressBatch = %v, %v; want every delivery renewed", stale, err)
			}
		default:
			for _, d := range ds {
				if err := d.InProgress(ctx); err != nil {
					b.Fatalf("InProgress: %v", err)
				}
			}
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(elapsed.Microseconds())/1000/float64(b.N), "ms/beat")
}
