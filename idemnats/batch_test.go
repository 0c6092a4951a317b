package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemnats"
)

func subscribe(t *testing.T, tr *idemnats.Transport, sub idem.Subscription) idem.BatchStream {
	t.Helper()
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.(idem.BatchStream)
}

func publishN(t testing.TB, tr *idemnats.Transport, topic string, from, n int) []idem.Message {
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

// A Next or NextBatch whose context is cancelled, not timed out, cannot
// have its pull request expire first: the request is withdrawn, and a
// message it brought is handed back at once, not held for the AckWait.
func TestCancelledNextGivesBack(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{})
	sub := idem.Subscription{Topic: "orders", Consumer: "c", AckWait: 10 * time.Minute}
	s := subscribe(t, tr, sub)
	publishN(t, tr, "orders", 0, 1)
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	received := 0
	for i := range 40 {
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wait := time.Duration(r.IntN(600)) * time.Microsecond
		wg.Go(func() {
			// A timer the test does not wait on would leak; this one
			// is waited for by wg.
			timer := time.NewTimer(wait)
			defer timer.Stop()
			<-timer.C
			cancel()
		})
		var ds []idem.Delivery
		var err error
		if i%2 == 0 {
			ds, err = s.NextBatch(ctx, 10)
		} else {
			var d idem.Delivery
			if d, err = s.Next(ctx); err == nil {
				ds = append(ds, d)
			}
		}
		wg.Wait()
		cancel()
		switch {
		case err == nil:
			for _, d := range ds {
				received++
				if err := d.Nack(t.Context(), 0); err != nil {
					t.Fatalf("Nack: %v", err)
				}
			}
		case !errors.Is(err, context.Canceled):
			t.Fatalf("cancelled Next = %v, want context.Canceled", err)
		}
	}
	// Handed back: here well within the AckWait of ten minutes.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next after 40 cancelled ones (%d received): %v; a cancelled pull kept the message", received, err)
	}
	if d.Attempt() < received+1 {
		t.Errorf("Attempt = %d, want at least %d", d.Attempt(), received+1)
	}
	t.Logf("%d received, attempt %d: %d deliveries reached a caller that had gone", received, d.Attempt(), d.Attempt()-received-1)
	if _, err := s.AckBatch(t.Context(), []idem.Delivery{d}); err != nil {
		t.Fatal(err)
	}
}

// NextBatch returns what is available at once, without waiting for a
// whole batch, and waits for the first message when there is none.
func TestNextBatchAvailable(t *testing.T) {
	t.Parallel()
	// The longest PollWait, well beyond the bound below: a NextBatch that
	// waited for its batch to fill would take the PollWait, while a loaded
	// machine's round trips take a second or two.
	tr := newIsolated(t, idemnats.Config{PollWait: 9 * time.Second})
	s := subscribe(t, tr, idem.Subscription{Topic: "orders", Consumer: "c"})
	msgs := publishN(t, tr, "orders", 0, 30)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	ds, err := s.NextBatch(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed > 6*time.Second {
		t.Errorf("NextBatch took %v: it waited for a batch it could not fill", elapsed)
	}
	if len(ds) != len(msgs) {
		t.Errorf("NextBatch(100) with %d messages available = %d deliveries", len(msgs), len(ds))
	}
	for i, d := range ds {
		if d.Message().ID != msgs[i].ID {
			t.Fatalf("delivery %d = %q, want %q", i, d.Message().ID, msgs[i].ID)
		}
	}
	if n, err := s.AckBatch(t.Context(), ds); err != nil || n != len(ds) {
		t.Fatalf("AckBatch = %d, %v; want %d", n, err, len(ds))
	}

	got := make(chan []idem.Delivery, 1)
	go func() {
		ds, err := s.NextBatch(ctx, 100)
		if err != nil {
			t.Errorf("waiting NextBatch: %v", err)
		}
		got <- ds
	}()
	late := publishN(t, tr, "orders", 100, 1)
	if ds := <-got; len(ds) == 0 || ds[0].Message().ID != late[0].ID {
		t.Fatalf("waiting NextBatch = %d deliveries, want %q first", len(ds), late[0].ID)
	} else if _, err := s.AckBatch(t.Context(), ds); err != nil {
		t.Fatal(err)
	}
}

// At the consumer's MaxAckPending the server hands out what room allows
// and keeps the request waiting: NextBatch takes the rest as soon as
// acknowledgements make room, and returns what it has when its request
// expires.
func TestNextBatchAtMaxAckPending(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{PollWait: 500 * time.Millisecond})
	s := subscribe(t, tr, idem.Subscription{Topic: "orders", Consumer: "c", MaxInFlight: 4})
	publishN(t, tr, "orders", 0, 10)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	first, err := s.NextBatch(ctx, 3)
	if err != nil || len(first) != 3 {
		t.Fatalf("NextBatch(3) = %d, %v; want 3", len(first), err)
	}
	// One place left: the request waits, and acknowledging the first
	// three lets it fill.
	got := make(chan []idem.Delivery, 1)
	go func() {
		ds, err := s.NextBatch(ctx, 4)
		if err != nil {
			t.Errorf("NextBatch(4) at MaxAckPending: %v", err)
		}
		got <- ds
	}()
	if n, err := s.AckBatch(ctx, first); err != nil || n != 3 {
		t.Fatalf("AckBatch = %d, %v; want 3", n, err)
	}
	second := <-got
	if len(second) < 1 || len(second) > 4 {
		t.Fatalf("NextBatch(4) = %d deliveries, want 1 to 4", len(second))
	}
	seen := map[string]bool{}
	for _, d := range append(first, second...) {
		seen[d.Message().ID] = true
	}
	// Room for one only: the batch of four ends with its request.
	start := time.Now()
	var third []idem.Delivery
	if len(second) == 4 {
		if _, err := s.AckBatch(ctx, second[:1]); err != nil {
			t.Fatal(err)
		}
		third, err = s.NextBatch(ctx, 4)
		if err != nil || len(third) != 1 {
			t.Fatalf("NextBatch(4) with one place = %d, %v; want 1", len(third), err)
		}
		if elapsed := time.Since(start); elapsed > 3*time.Second {
			t.Errorf("NextBatch took %v, past its request's expiry", elapsed)
		}
		second = second[1:]
	}
	for _, d := range third {
		seen[d.Message().ID] = true
	}
	rest := append(second, third...)
	for len(seen) < 10 {
		if _, err := s.AckBatch(ctx, rest); err != nil {
			t.Fatal(err)
		}
		rest, err = s.NextBatch(ctx, 10)
		if err != nil {
			t.Fatalf("NextBatch after room was made (%d of 10 seen): %v", len(seen), err)
		}
		if len(rest) > 4 {
			t.Errorf("NextBatch handed out %d, past MaxAckPending 4", len(rest))
		}
		for _, d := range rest {
			if d.Attempt() != 1 {
				t.Errorf("message %q: Attempt %d", d.Message().ID, d.Attempt())
			}
			seen[d.Message().ID] = true
		}
	}
}

// Two streams of one consumer name compete: the server refuses a
// no_wait pull request while the other's waiting request asks for more
// than there is, and NextBatch then pulls without no_wait.
func TestNextBatchCompeting(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{PollWait: 2 * time.Second})
	sub := idem.Subscription{Topic: "orders", Consumer: "c"}
	streams := []idem.BatchStream{subscribe(t, tr, sub), subscribe(t, tr, sub)}
	const n = 500
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(func() {
			for {
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done {
					return
				}
				wait, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				ds, err := s.NextBatch(wait, 50)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					continue
				}
				if err != nil {
					t.Errorf("NextBatch: %v", err)
					return
				}
				mu.Lock()
				for _, d := range ds {
					seen[d.Message().ID] = true
				}
				mu.Unlock()
				if _, err := s.AckBatch(ctx, ds); err != nil {
					t.Errorf("AckBatch: %v", err)
					return
				}
			}
		})
	}
	for i := 0; i < n; i += 10 {
		publishN(t, tr, "orders", i, 10)
	}
	wg.Wait()
	if len(seen) != n {
		t.Errorf("the competing streams got %d of %d messages", len(seen), n)
	}
}

// A delivery whose AckWait ended, and whose message this stream has
// received again, no longer stands for the message: AckBatch passes over
// it, and its own methods refuse.
func TestSupersededDelivery(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{})
	s := subscribe(t, tr, idem.Subscription{Topic: "orders", Consumer: "c", AckWait: 300 * time.Millisecond})
	publishN(t, tr, "orders", 0, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	old, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Next(ctx) // after the AckWait
	if err != nil {
		t.Fatal(err)
	}
	if again.Message().ID != old.Message().ID || again.Attempt() != 2 {
		t.Fatalf("second delivery = %q attempt %d, want %q attempt 2", again.Message().ID, again.Attempt(), old.Message().ID)
	}
	for what, err := range map[string]error{
		"Ack":        old.Ack(ctx),
		"Nack":       old.Nack(ctx, 0),
		"Term":       old.Term(ctx),
		"InProgress": old.InProgress(ctx),
	} {
		if !errors.Is(err, idemnats.ErrStaleDelivery) {
			t.Errorf("%s of the superseded delivery = %v, want ErrStaleDelivery", what, err)
		}
	}
	n, err := s.AckBatch(ctx, []idem.Delivery{old, again})
	if err != nil || n != 1 {
		t.Errorf("AckBatch(superseded, current) = %d, %v; want 1, nil", n, err)
	}
	quiet, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if d, err := s.Next(quiet); err == nil {
		t.Errorf("Next after AckBatch = %q attempt %d, want nothing", d.Message().ID, d.Attempt())
	}
}

// Publish pipelines its messages, whatever its window, and they are
// stored in the order given.
func TestPublishWindow(t *testing.T) {
	t.Parallel()
	for _, window := range []int{1, 7, 0} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) {
			t.Parallel()
			tr := newIsolated(t, idemnats.Config{PublishWindow: window})
			s := subscribe(t, tr, idem.Subscription{Topic: "orders", Consumer: "c"})
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

func TestPublishContext(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := tr.Publish(ctx, idem.Message{ID: "m1", Topic: "orders"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Publish(cancelled context) = %v, want context.Canceled", err)
	}
}
