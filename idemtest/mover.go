package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// MoverWorld is what TestOutboxMover runs on: an outbox and the transport
// that moves its entries, in one database, and the transport's subscribing
// side.
type MoverWorld struct {
	Outbox     idem.Outbox
	Mover      idem.OutboxMover
	Subscriber idem.Subscriber
}

// TestOutboxMover runs the conformance suite of idem.OutboxMover as
// subtests of t: entries arrive through a subscription whole and in the
// outbox's order, and are gone from the outbox; entries under a relay's
// live lease are left to it until the lease ends; movers running at once
// move every entry exactly once; an outbox of another kind is refused with
// ok false and nothing done; a limit below 1 is refused with
// idem.ErrInvalidArgument.
//
// newWorld is called once per subtest, from that subtest's goroutine, and
// must return a fresh world whose outbox reads the time from clock. It
// should register any cleanup with t.Cleanup. Subtests run in parallel.
func TestOutboxMover(t *testing.T, newWorld func(t *testing.T, clock idem.Clock) MoverWorld) {
	t.Helper()
	for _, tc := range moverTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(Start)
			w := newWorld(t, clock)
			if w.Outbox == nil || w.Mover == nil || w.Subscriber == nil {
				t.Fatal("newWorld returned a MoverWorld with a nil field")
			}
			tc.run(t, &moverEnv{t: t, ctx: t.Context(), clock: clock, w: w})
		})
	}
}

var moverTests = []struct {
	name string
	run  func(t *testing.T, e *moverEnv)
}{
	{"MovesInOrder", testMoveInOrder},
	{"LeavesLeased", testMoveLeavesLeased},
	{"ConcurrentMovers", testMoveConcurrent},
	{"ForeignOutbox", testMoveForeign},
	{"Invalid", testMoveInvalid},
}

type moverEnv struct {
	t     *testing.T
	ctx   context.Context
	clock *idemmem.Clock
	w     MoverWorld
}

func (e *moverEnv) subscribe() idem.Stream {
	e.t.Helper()
	s, err := e.w.Subscriber.Subscribe(e.ctx, idem.Subscription{Topic: event(0).Topic, Consumer: "mover-test"})
	if err != nil {
		e.t.Fatalf("Subscribe: %v", err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *moverEnv) add(msgs ...idem.Message) {
	e.t.Helper()
	if err := e.w.Outbox.Add(e.ctx, msgs...); err != nil {
		e.t.Fatalf("Add(%d messages): %v", len(msgs), err)
	}
}

func (e *moverEnv) move(limit int) int {
	e.t.Helper()
	n, ok, err := e.w.Mover.MoveOutbox(e.ctx, e.w.Outbox, limit)
	if err != nil || !ok {
		e.t.Fatalf("MoveOutbox(%d) = %d, %v, %v; want ok", limit, n, ok, err)
	}
	if n < 0 || n > limit {
		e.t.Fatalf("MoveOutbox(%d) moved %d", limit, n)
	}
	return n
}

// receive takes n deliveries, acknowledging each, and returns their
// messages in delivery order.
func (e *moverEnv) receive(s idem.Stream, n int) []idem.Message {
	e.t.Helper()
	var got []idem.Message
	for range n {
		ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
		d, err := s.Next(ctx)
		cancel()
		if err != nil {
			e.t.Fatalf("Next, waiting for moved message %d of %d: %v", len(got)+1, n, err)
		}
		got = append(got, d.Message())
		if err := d.Ack(e.ctx); err != nil {
			e.t.Fatalf("Ack: %v", err)
		}
	}
	return got
}

// none checks that s delivers nothing for a moment.
func (e *moverEnv) none(s idem.Stream, why string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := s.Next(ctx); err == nil {
		e.t.Fatalf("Next = %q, want nothing: %s", d.Message().ID, why)
	}
}

// unsent is how many entries the outbox would still hand a relay. It
// leases them: only a test's last look may use it.
func (e *moverEnv) unsent() int {
	e.t.Helper()
	got, err := e.w.Outbox.Claim(e.ctx, "counting-relay", 10000, time.Nanosecond)
	if err != nil {
		e.t.Fatalf("Claim: %v", err)
	}
	return len(got)
}

func testMoveInOrder(t *testing.T, e *moverEnv) {
	s := e.subscribe()
	var msgs []idem.Message
	for i := range 12 {
		msgs = append(msgs, event(i))
	}
	e.add(msgs...)
	if n := e.move(5); n != 5 {
		t.Fatalf("MoveOutbox(5) of 12 entries moved %d, want 5", n)
	}
	if n := e.move(100); n != 7 {
		t.Fatalf("MoveOutbox(100) of the 7 left moved %d, want 7", n)
	}
	if n := e.move(100); n != 0 {
		t.Fatalf("MoveOutbox of an empty outbox moved %d", n)
	}
	got := e.receive(s, len(msgs))
	for i, m := range got {
		if diff := messageDiff(m, msgs[i], true); diff != "" {
			t.Fatalf("moved message %d: %s", i, diff)
		}
	}
	e.none(s, "every entry was moved once")
	e.clock.Advance(time.Hour)
	if n := e.unsent(); n != 0 {
		t.Errorf("%d entries left in the outbox after they were moved", n)
	}
}

func testMoveLeavesLeased(t *testing.T, e *moverEnv) {
	s := e.subscribe()
	e.add(event(1), event(2), event(3))
	leased, err := e.w.Outbox.Claim(e.ctx, "relay-1", 1, outboxLease)
	if err != nil || len(leased) != 1 {
		t.Fatalf("Claim = %v, %v; want one entry", leased, err)
	}
	if n := e.move(10); n != 2 {
		t.Fatalf("MoveOutbox moved %d, want 2: evt-1 is under relay-1's lease", n)
	}
	got := e.receive(s, 2)
	if got[0].ID != "evt-2" || got[1].ID != "evt-3" {
		t.Fatalf("moved %s, %s; want evt-2, evt-3", got[0].ID, got[1].ID)
	}
	e.clock.Advance(outboxLease + time.Millisecond)
	if n := e.move(10); n != 1 {
		t.Fatalf("MoveOutbox after the lease ended moved %d, want 1", n)
	}
	if got := e.receive(s, 1); got[0].ID != "evt-1" {
		t.Fatalf("moved %s, want evt-1", got[0].ID)
	}
}

func testMoveConcurrent(t *testing.T, e *moverEnv) {
	const n, movers = 300, 4
	s := e.subscribe()
	var msgs []idem.Message
	for i := range n {
		msgs = append(msgs, event(i))
	}
	e.add(msgs...)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	errs := make(chan error, movers)
	for range movers {
		wg.Go(func() {
			// A mover may find nothing while the others hold the rest
			// (SKIP LOCKED); between them, they always make progress.
			for idle := 0; idle < 10000; {
				moved, ok, err := e.w.Mover.MoveOutbox(e.ctx, e.w.Outbox, 7)
				if err != nil || !ok {
					errs <- fmt.Errorf("MoveOutbox = %d, %v, %v", moved, ok, err)
					return
				}
				mu.Lock()
				total += moved
				done := total >= n
				mu.Unlock()
				if done {
					return
				}
				if moved == 0 {
					idle++
				}
			}
			errs <- errors.New("a mover found nothing to move 10,000 times before every entry was moved")
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total != n {
		t.Fatalf("movers moved %d in all, want %d", total, n)
	}
	seen := make(map[string]bool)
	for _, m := range e.receive(s, n) {
		if seen[m.ID] {
			t.Fatalf("%s moved twice", m.ID)
		}
		seen[m.ID] = true
	}
	e.none(s, "each entry is moved once")
}

// foreignOutbox is an outbox of no database: no mover may take it.
type foreignOutbox struct{}

func (foreignOutbox) Add(context.Context, ...idem.Message) error { return errors.New("foreign") }
func (foreignOutbox) Claim(context.Context, string, int, time.Duration) ([]idem.OutboxEntry, error) {
	return nil, errors.New("foreign")
}
func (foreignOutbox) MarkSent(context.Context, ...int64) error { return errors.New("foreign") }

func testMoveForeign(t *testing.T, e *moverEnv) {
	e.add(event(1))
	if n, ok, err := e.w.Mover.MoveOutbox(e.ctx, foreignOutbox{}, 10); ok || n != 0 || err != nil {
		t.Errorf("MoveOutbox(another kind of outbox) = %d, %v, %v; want 0, false, nil", n, ok, err)
	}
	if n := e.unsent(); n != 1 {
		t.Errorf("%d entries left in the mover's own outbox, want 1: nothing may have moved", n)
	}
}

func testMoveInvalid(t *testing.T, e *moverEnv) {
	e.add(event(1))
	for _, limit := range []int{0, -3} {
		if _, _, err := e.w.Mover.MoveOutbox(e.ctx, e.w.Outbox, limit); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("MoveOutbox(limit %d) = %v, want idem.ErrInvalidArgument", limit, err)
		}
	}
	if n := e.unsent(); n != 1 {
		t.Errorf("%d entries left after refused moves, want 1", n)
	}
}
