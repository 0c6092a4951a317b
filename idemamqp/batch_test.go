package idemamqp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
)

func publishN(t testing.TB, tr *idemamqp.Transport, topic string, from, n int) []idem.Message {
	t.Helper()
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{ID: fmt.Sprintf("m%d", from+i), Topic: topic, Payload: []byte("p")}
	}
	if err := tr.Publish(context.Background(), msgs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return msgs
}

// takeAll takes n deliveries from s, in batches.
func takeAll(t *testing.T, s idem.BatchStream, n int) []idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var ds []idem.Delivery
	for len(ds) < n {
		more, err := s.NextBatch(ctx, n-len(ds))
		if err != nil {
			t.Fatalf("NextBatch after %d of %d: %v", len(ds), n, err)
		}
		ds = append(ds, more...)
	}
	return ds
}

// AckBatch acknowledges exactly the deliveries it is given, whatever
// their delivery tags: an earlier delivery left unsettled, or one in a
// gap, is not swept up by an ack with multiple set.
func TestAckBatchGaps(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{})
	sub := idem.Subscription{Topic: "orders", Consumer: "c"}
	is, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	s := is.(idem.BatchStream)
	msgs := publishN(t, tr, "orders", 0, 10)
	ds := takeAll(t, s, 10)
	for i, d := range ds {
		if d.Message().ID != msgs[i].ID {
			t.Fatalf("delivery %d = %q, want %q", i, d.Message().ID, msgs[i].ID)
		}
	}
	// The first three in one ack with multiple set, with the fourth held
	// and the fifth after it; then three with the fourth still held
	// before them, and the ninth in a gap.
	for _, acked := range [][]idem.Delivery{{ds[0], ds[1], ds[2], ds[4]}, {ds[5], ds[8], ds[6]}} {
		n, err := s.AckBatch(t.Context(), acked)
		if err != nil || n != len(acked) {
			t.Fatalf("AckBatch = %d, %v; want %d", n, err, len(acked))
		}
		if n, err := s.AckBatch(t.Context(), acked); err != nil || n != 0 {
			t.Errorf("AckBatch again = %d, %v; want 0, nil", n, err)
		}
	}
	// Closing the stream puts back what it holds unsettled: exactly the
	// three left out.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	is2, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	s2 := is2.(idem.BatchStream)
	defer s2.Close()
	back := takeAll(t, s2, 3)
	got := map[string]int{}
	for _, d := range back {
		got[d.Message().ID] = d.Attempt()
	}
	for _, i := range []int{3, 7, 9} {
		if got[msgs[i].ID] != 2 {
			t.Errorf("after the restart: %v, want %s, %s and %s, each at attempt 2", got, msgs[3].ID, msgs[7].ID, msgs[9].ID)
			break
		}
	}
	if n, err := s2.AckBatch(t.Context(), back); err != nil || n != 3 {
		t.Fatalf("AckBatch = %d, %v; want 3", n, err)
	}
	quiet, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if d, err := s2.Next(quiet); err == nil {
		t.Errorf("Next = %q attempt %d, want nothing: every message was acknowledged", d.Message().ID, d.Attempt())
	}
}

// Publish pipelines its messages, whatever its window, and they are
// routed in the order given.
func TestPublishWindow(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 7, 0} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			tr := newIsolated(t, idemamqp.Config{PublishWindow: window, Mandatory: true})
			is, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
			if err != nil {
				t.Fatal(err)
			}
			defer is.Close()
			s := is.(idem.BatchStream)
			msgs := publishN(t, tr, "orders", 0, 600)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			var got []string
			for len(got) < len(msgs) {
				ds, err := s.NextBatch(ctx, 200)
				if err != nil {
					t.Fatalf("NextBatch after %d: %v", len(got), err)
				}
				for _, d := range ds {
					got = append(got, d.Message().ID)
				}
				if _, err := s.AckBatch(ctx, ds); err != nil {
					t.Fatal(err)
				}
			}
			for i, id := range got {
				if id != msgs[i].ID {
					t.Fatalf("message %d is %q, want %q", i, id, msgs[i].ID)
				}
			}
		})
	}
}
