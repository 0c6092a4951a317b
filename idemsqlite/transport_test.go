package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func newTransport(t *testing.T, db *idemsqlite.DB, clock idem.Clock) *idemsqlite.Transport {
	t.Helper()
	tr, err := idemsqlite.NewTransport(t.Context(), db, &idemsqlite.TransportConfig{Clock: clock, Poll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// The attempt count and an unsettled message survive a restart: a new
// Transport on the same file carries on where the old one stopped.
func TestTransportRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	sub := idem.Subscription{Topic: "payments", Consumer: "settlement", AckWait: time.Minute}
	m := idem.Message{ID: "evt-1", Topic: "payments", Payload: []byte("x")}

	first := newTransport(t, db, clock)
	s, err := first.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 2; want++ {
		d := next(t, s)
		if d.Attempt() != want {
			t.Fatalf("Attempt = %d, want %d", d.Attempt(), want)
		}
		if want == 1 {
			if err := d.Nack(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The second delivery is never settled: the process "dies".
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := newTransport(t, db, clock)
	s2, err := second.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, s2)
	if d.Message().ID != m.ID || d.Attempt() != 3 {
		t.Fatalf("after a restart: %q attempt %d, want %q attempt 3", d.Message().ID, d.Attempt(), m.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); !errors.Is(err, idemsqlite.ErrStaleDelivery) {
		t.Errorf("second Ack = %v, want ErrStaleDelivery", err)
	}
}

// Publish and Ack join the caller's transaction.
func TestTransportJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	tr := newTransport(t, db, idemmem.NewClock(idemtest.Start))
	s, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := tr.Publish(ctx, idem.Message{ID: "rolled-back", Topic: "payments"}); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if err := tr.Publish(ctx, idem.Message{ID: "committed", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	d := next(t, s)
	if d.Message().ID != "committed" {
		t.Fatalf("Next = %q, want the committed message only", d.Message().ID)
	}
	// An Ack rolled back with the caller's transaction leaves the message
	// held: the delivery can still be settled.
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := d.Ack(ctx); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Errorf("Ack after the rolled-back Ack = %v, want nil", err)
	}
}

func next(t *testing.T, s idem.Stream) idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return d
}

func TestTransportPurge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, openMessagesDB(t), clock)
	a, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "b"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := tr.Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Hour)
	purge := func(want int, why string) {
		t.Helper()
		if n, err := tr.Purge(ctx, clock.Now(), 10); err != nil || n != want {
			t.Errorf("Purge = %d, %v; want %d: %s", n, err, want, why)
		}
	}
	if _, err := tr.Purge(ctx, clock.Now(), 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Purge(limit 0) = %v, want idem.ErrInvalidArgument", err)
	}
	purge(0, "no consumer has had anything")
	// a settles everything; b holds m-0 unsettled and has not had m-1, m-2.
	for range 3 {
		if err := next(t, a).Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held := next(t, b)
	purge(0, "b has not settled any")
	if err := held.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := tr.Purge(ctx, idemtest.Start, 10); err != nil || n != 0 {
		t.Errorf("Purge(before they were published) = %d, %v; want 0", n, err)
	}
	purge(1, "both have settled m-0")
	// b still gets the rest.
	for i := 1; i < 3; i++ {
		d := next(t, b)
		if d.Message().ID != fmt.Sprint("m-", i) {
			t.Fatalf("b got %q, want m-%d", d.Message().ID, i)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	purge(2, "both have settled every message")
}

// Two Transports on two DBs of one file, as two processes would have,
// share a consumer name: each message goes to one of them, once, and a
// message published by one is found by the other's poll.
func TestTransportTwoProcesses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "shared.db")
	var streams []idem.Stream
	var pubs []*idemsqlite.Transport
	for range 2 {
		db, err := idemsqlite.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		tr := newTransport(t, db, idem.SystemClock{})
		s, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "settlement", AckWait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		streams, pubs = append(streams, s), append(pubs, tr)
	}
	const n = 200
	for i := range n {
		if err := pubs[i%2].Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu   sync.Mutex
		got  = make(map[string]int)
		wg   sync.WaitGroup
		done = make(chan struct{})
		stop = sync.OnceFunc(func() { close(done) })
	)
	for _, s := range streams {
		wg.Go(func() {
			for {
				ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				d, err := s.Next(ctx)
				cancel()
				if err != nil {
					select {
					case <-done:
						return
					default:
						continue
					}
				}
				if err := d.Ack(t.Context()); err != nil {
					t.Errorf("Ack: %v", err)
				}
				mu.Lock()
				got[d.Message().ID]++
				if len(got) == n {
					stop()
				}
				mu.Unlock()
			}
		})
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Error("not every message arrived within a minute")
		stop()
	}
	wg.Wait()
	for id, c := range got {
		if c != 1 {
			t.Errorf("message %q delivered %d times, want once", id, c)
		}
	}
	if len(got) != n {
		t.Errorf("%d distinct messages, want %d", len(got), n)
	}
}
