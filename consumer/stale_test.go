package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

// These tests make a delivery stop being the consumer's own while the
// consumer works on it: the in-memory transport's AckWait ends (the clock
// moves past it, the heartbeat's timers never fire), so that the
// delivery's InProgress answers idem.ErrStaleDelivery, as a transport
// whose lease ended or whose partition was taken away does. The consumer
// holds no more deliveries than MaxPending lets it, so that nothing hands
// the message out again before the consumer has decided what to do.

// staleAckWait is the AckWait of these tests' consumers.
const staleAckWait = 30 * time.Second

// gate holds the first call of hold until release, telling entered.
type gate struct {
	once     sync.Once
	entered  chan struct{}
	released chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}), released: make(chan struct{})}
}

func (g *gate) hold() {
	g.once.Do(func() {
		close(g.entered)
		<-g.released
	})
}

// wait returns once the held call has begun.
func (g *gate) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(waitLimit):
		t.Fatalf("%s did not begin within %s", what, waitLimit)
	}
}

func (g *gate) release() { close(g.released) }

// staleHead is a handler whose first attempt at evt-1 holds at g, then
// fails for good, so that the test can end its AckWait under it; every
// other delivery is applied once, by its dedup key, in the order noted.
type staleHead struct {
	h     *harness
	g     *gate
	mu    sync.Mutex
	order []string
}

func (s *staleHead) handle(ctx context.Context, _ idem.Message) error {
	info, _ := consumer.InfoFromContext(ctx)
	if info.DedupKey == "evt-1" && info.Attempt == 1 {
		s.g.hold()
		return idem.Permanent(errors.New("card declined"))
	}
	if err := s.h.applied.Add(ctx, info.DedupKey, 1); err != nil {
		return err
	}
	s.mu.Lock()
	s.order = append(s.order, info.DedupKey)
	s.mu.Unlock()
	return nil
}

// appliedInOrder checks that the messages were applied in the order want.
func (s *staleHead) appliedInOrder(t *testing.T, want ...string) {
	t.Helper()
	s.mu.Lock()
	got := slices.Clone(s.order)
	s.mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("applied in the order %v, want %v", got, want)
	}
}

// holdingInbox holds the first inbox transaction of one message (its
// dedup key is its ID) at its start, in both the one-message and the
// batch paths.
type holdingInbox struct {
	*idemmem.Inbox
	id string
	g  *gate
}

func (i *holdingInbox) Process(ctx context.Context, consumer, dedupKey string, fn func(context.Context) error) error {
	if dedupKey == i.id {
		i.g.hold()
	}
	return i.Inbox.Process(ctx, consumer, dedupKey, fn)
}

func (i *holdingInbox) ProcessBatch(ctx context.Context, consumer string, keys []string, fn func(context.Context, []bool) error) error {
	if slices.Contains(keys, i.id) {
		i.g.hold()
	}
	return i.Inbox.ProcessBatch(ctx, consumer, keys, fn)
}

// A keyed message whose delivery stopped being the consumer's own while
// its handler ran (a stalled process: its AckWait ended), and whose
// attempt then failed for good, is let go: not dead-lettered, its key not
// held back, since its next delivery is what applies it (a dead letter
// written from here would park that very delivery). The later messages of
// its key that the consumer holds, still its own, are handed back with it
// (Nack, no delay), so that they do not overtake its next delivery; the
// places they took are given back, so that the consumer takes all three
// again, and applies them in their order, each once, and then holds as
// many deliveries as MaxPending lets it.
func TestStaleHeadIsLetGoWithItsKeyMates(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = staleAckWait
	// Room for a fourth delivery, whose ask says that evt-2 and evt-3 are
	// in memory, behind evt-1 (taken from the transport, they may not be
	// yet, and would then be handed back on another path); held until
	// evt-1 is let go, so that evt-1's delivery again, once its AckWait
	// ended, is not taken before.
	cfg.Concurrency, cfg.MaxPending = 1, 4
	asked, more := h.rec.holdNext(3)
	g := newGate()
	sh := &staleHead{h: h, g: g}
	g4 := newGate()
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "evt-4" {
			g4.hold()
		}
		return sh.handle(ctx, m)
	})
	// Registered after the consumer's stop, so run before it: a failure
	// that leaves evt-4's handler held lets it end.
	release4 := sync.OnceFunc(g4.release)
	t.Cleanup(release4)
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"), msg("evt-3", "acct-1"))
	waitAsked(t, "evt-2 and evt-3 put behind evt-1", asked)
	// evt-1's AckWait ended 5s ago; evt-2's and evt-3's have 15s left.
	h.clock.Advance(15 * time.Second)
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	more()

	waitFor(t, "the three messages processed", func() bool { return c.Stats().Processed == 3 })
	sh.appliedInOrder(t, "evt-1", "evt-2", "evt-3")
	for _, id := range []string{"evt-1", "evt-2", "evt-3"} {
		if n := h.applied.Get(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	if s := c.Stats(); s.Stale != 1 || s.DeadLettered != 0 || s.Parked != 0 {
		t.Errorf("Stats = %+v, want 1 stale, none dead-lettered or parked", s)
	}
	if dls := h.letters(); len(dls) != 0 {
		t.Errorf("%d dead letters, want none: the stale delivery was dead-lettered", len(dls))
	}
	if _, held, err := h.ledger.HeldBack(context.Background(), cfg.Name, "acct-1"); err != nil || held {
		t.Errorf("HeldBack(acct-1) = %v, %v; want the key not held", held, err)
	}
	if ops := h.rec.Ops("evt-1"); countOp(ops, "term") != 0 || countOp(ops, "deliver") != 2 || countOp(ops, "ack") != 1 {
		t.Errorf("evt-1's deliveries: %v; want the first let go unsettled, the second acknowledged", ops)
	}
	for _, id := range []string{"evt-2", "evt-3"} {
		if ops := h.rec.Ops(id); len(ops) < 2 || ops[0] != "deliver" || ops[1] != "nack 0s" || countOp(ops, "deliver") != 2 {
			t.Errorf("%s's deliveries: %v; want the first handed back at once (nack 0s) with evt-1, then delivered again", id, ops)
		}
	}

	// Every place is free again: while evt-4's handler runs, the consumer
	// takes MaxPending deliveries, evt-4 among them.
	before := h.rec.Taken()
	h.publish(msg("evt-4", "acct-2"), msg("evt-5", "acct-3"), msg("evt-6", "acct-4"), msg("evt-7", "acct-5"))
	g4.wait(t, "evt-4's handler")
	waitFor(t, "MaxPending deliveries taken while evt-4's handler runs (the places of evt-1 and its key-mates given back)", func() bool {
		return h.rec.Taken()-before == cfg.MaxPending
	})
	release4()
	waitFor(t, "the seven messages processed", func() bool { return c.Stats().Processed == 7 })
}

// A message of a key held back behind a dead letter is parked, unless its
// delivery is no longer the consumer's own by then: it is let go, not
// parked from here, and its next delivery, which is the consumer's own,
// parks it. The stale delivery is neither parked nor acknowledged.
func TestStaleDeliveryOfAHeldKeyIsLetGoNotParked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	cfg := h.config()
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 1
	g := newGate()
	cfg.Inbox = &holdingInbox{Inbox: h.inbox, id: "evt-2", g: g}
	if err := h.ledger.HoldBack(ctx, cfg.Name, "acct-1", "dl-1"); err != nil {
		t.Fatal(err)
	}
	c, _ := h.start(cfg, h.apply)
	h.publish(msg("evt-2", "acct-1"))
	g.wait(t, "evt-2's inbox transaction")
	h.clock.Advance(staleAckWait + time.Second)
	g.release()

	waitFor(t, "evt-2 parked", func() bool { return c.Stats().Parked == 1 })
	if s := c.Stats(); s.Stale != 1 || s.Processed != 0 {
		t.Errorf("Stats = %+v, want 1 stale, 1 parked, none processed", s)
	}
	if ops := h.rec.Ops("evt-2"); countOp(ops, "deliver") != 2 || countOp(ops, "ack") != 1 || ops[len(ops)-1] != "ack" {
		t.Errorf("evt-2's deliveries: %v; want the first let go unsettled, the second parked and acknowledged", ops)
	}
	parked, err := h.ledger.LetGo(ctx, cfg.Name, "acct-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].ID != "evt-2" {
		t.Errorf("parked behind the dead letter: %v, want evt-2 once", parked)
	}
	if n := h.applied.Get("evt-2"); n != 0 {
		t.Errorf("evt-2 applied %d times, want never (its key is held back)", n)
	}
}

// A message without a key whose delivery stopped being the consumer's own
// while its handler ran, and whose attempt failed transiently, is let go
// instead of retried: its retry would be handed back with a Nack, which a
// stale delivery cannot give (it would count for nothing, or hand the new
// holder's message back), and it is not counted as a retry. Its next
// delivery applies it.
func TestStaleUnkeyedRetryIsLetGo(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 1
	g := newGate()
	var calls attemptsCounter
	handler := func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 {
			g.hold()
			return errFlaky
		}
		return h.apply(ctx, m)
	}
	c, _ := h.start(cfg, handler)
	h.publish(msg("evt-1", ""))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(staleAckWait + time.Second)
	g.release()

	waitFor(t, "evt-1 processed", func() bool { return c.Stats().Processed == 1 })
	if s := c.Stats(); s.Stale != 1 || s.Retried != 0 {
		t.Errorf("Stats = %+v, want 1 stale and no retry", s)
	}
	if ops := h.rec.Ops("evt-1"); countOp(ops, "deliver") != 2 || countOp(ops, "ack") != 1 || slices.ContainsFunc(ops, isNack) {
		t.Errorf("evt-1's deliveries: %v; want the first let go without a Nack, the second acknowledged", ops)
	}
	if got := calls.Seen("evt-1"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("the handler's attempts: %v, want [1 2] (the transport's count)", got)
	}
	if n := h.applied.Get("evt-1"); n != 1 {
		t.Errorf("evt-1 applied %d times, want once", n)
	}
}

func isNack(op string) bool { return len(op) >= 4 && op[:4] == "nack" }

// Stale, like every count of Stats, counts a delivery once what was done
// with it is told to the transport: a stale head's key-mates handed back
// (Nack) before it is counted, so that whoever reads Stale and then looks
// at the transport finds them handed back.
func TestStaleCountedOnceItsKeyMatesAreHandedBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = staleAckWait
	// Room for a third delivery, whose ask says that evt-2 is in memory,
	// behind evt-1; held, so that evt-1's delivery again, once its AckWait
	// ended, is not taken before evt-1 is let go.
	cfg.Concurrency, cfg.MaxPending = 1, 3
	asked, more := h.rec.holdNext(2)
	g := newGate()
	handler := func(ctx context.Context, m idem.Message) error {
		if info, _ := consumer.InfoFromContext(ctx); m.ID == "evt-1" && info.Attempt == 1 {
			g.hold()
			return idem.Permanent(errors.New("card declined"))
		}
		return h.apply(ctx, m)
	}
	gate := make(chan struct{})
	h.rec.nackGate = gate
	c, _ := h.start(cfg, handler)
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"))
	waitAsked(t, "evt-2 put behind evt-1", asked)
	h.clock.Advance(15 * time.Second)
	g.release()

	waitFor(t, "evt-2 handed back", func() bool { return countOp(h.rec.Ops("evt-2"), "nack 0s") == 1 })
	if s := c.Stats(); s.Stale != 0 {
		t.Errorf("Stats = %+v while evt-2's Nack is held; want nothing stale counted yet", s)
	}
	close(gate)
	waitFor(t, "evt-1's first delivery counted stale", func() bool { return c.Stats().Stale == 1 })
	more()
	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
}

// withoutIDs hands out its subscriber's deliveries with their message IDs
// blank, as a transport does for a message whose publisher set none (no
// Nats-Msg-Id, no AMQP message_id).
type withoutIDs struct{ idem.Subscriber }

func (s withoutIDs) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	st, err := s.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return withoutIDsStream{st}, nil
}

type withoutIDsStream struct{ idem.Stream }

func (s withoutIDsStream) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	return withoutIDDelivery{d}, nil
}

type withoutIDDelivery struct{ idem.Delivery }

func (d withoutIDDelivery) Message() idem.Message {
	m := d.Delivery.Message()
	m.ID = ""
	return m
}

// payloadID is a DedupKey that reads the event ID from the payload.
func payloadID(m idem.Message) (string, error) {
	var p struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return "", err
	}
	return p.ID, nil
}

// Messages without a message ID, de-duplicated by an event ID in their
// payload, are told apart by it: when a stale head is let go, the next
// message of its key, whose message ID is as blank as the head's, is not
// taken for the head's later delivery and applied in its place, ahead of
// the head's own next delivery.
func TestStaleHeadWithoutMessageIDIsNotReplacedByItsKeyMate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Subscriber = withoutIDs{h.rec}
	cfg.DedupKey = payloadID
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 3
	g := newGate()
	sh := &staleHead{h: h, g: g}
	// The consumer's ask for a third delivery says that evt-2 is in
	// memory, behind evt-1; it is held until evt-1 is let go, so that
	// evt-1's later delivery is not taken before.
	asked, more := h.rec.holdNext(2)
	c, _ := h.start(cfg, sh.handle)
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"))
	waitAsked(t, "evt-2 put behind evt-1", asked)
	h.clock.Advance(15 * time.Second)
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	more()

	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	sh.appliedInOrder(t, "evt-1", "evt-2")
	if ops := h.rec.Ops("evt-2"); len(ops) < 2 || ops[1] != "nack 0s" {
		t.Errorf("evt-2's deliveries: %v; want the first handed back (nack 0s) with evt-1", ops)
	}
}

// A stale head whose later delivery the consumer already holds, behind the
// key's next message (the transport delivered it again to the same
// stream), is replaced by that delivery at the head of the key: the next
// message is neither handed back nor applied before it.
func TestStaleHeadsLaterDeliveryTakesItsPlace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 4
	g := newGate()
	sh := &staleHead{h: h, g: g}
	// The consumer's ask for a fourth delivery says that evt-1's later
	// delivery is in memory, behind evt-2.
	asked, more := h.rec.holdNext(3)
	c, _ := h.start(cfg, sh.handle)
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"))
	waitFor(t, "evt-2 taken behind evt-1", func() bool { return h.rec.Taken() == 2 })
	// evt-1's AckWait ends, and it is delivered again behind evt-2.
	h.clock.Advance(15 * time.Second)
	waitAsked(t, "evt-1 delivered again behind evt-2", asked)
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	more()

	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	sh.appliedInOrder(t, "evt-1", "evt-2")
	if s := c.Stats(); s.Stale != 1 || s.DeadLettered != 0 {
		t.Errorf("Stats = %+v, want 1 stale, none dead-lettered", s)
	}
	if ops := h.rec.Ops("evt-2"); slices.ContainsFunc(ops, isNack) || countOp(ops, "deliver") != 1 {
		t.Errorf("evt-2's deliveries: %v; want one, not handed back", ops)
	}
	if ops := h.rec.Ops("evt-1"); countOp(ops, "ack") != 1 || slices.ContainsFunc(ops, isNack) {
		t.Errorf("evt-1's deliveries: %v; want the first let go unsettled, the second acknowledged", ops)
	}
}

// A stale head whose later delivery the consumer holds right behind it,
// before any other message of its key (the transport delivered it again
// before the next message came), is replaced by that delivery as well:
// nothing is handed back, not the later delivery nor the message behind
// it, and each is applied once, in order.
func TestStaleHeadsLaterDeliveryRightBehindItTakesItsPlace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = staleAckWait
	// Room for a fourth delivery, whose ask says that evt-2 is in memory,
	// behind evt-1's later delivery (taken from the transport, it may not
	// be yet, and would then be put behind it only after evt-1 is let go).
	cfg.Concurrency, cfg.MaxPending = 1, 4
	asked, more := h.rec.holdNext(3)
	g := newGate()
	sh := &staleHead{h: h, g: g}
	c, _ := h.start(cfg, sh.handle)
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	// evt-1's AckWait ends, and it is delivered again, first behind itself.
	h.clock.Advance(staleAckWait + time.Second)
	waitFor(t, "evt-1 delivered again", func() bool { return h.rec.Taken() == 2 })
	h.publish(msg("evt-2", "acct-1"))
	waitAsked(t, "evt-2 put behind evt-1's later delivery", asked)
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	more()

	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	sh.appliedInOrder(t, "evt-1", "evt-2")
	if s := c.Stats(); s.Stale != 1 || s.DeadLettered != 0 {
		t.Errorf("Stats = %+v, want 1 stale, none dead-lettered", s)
	}
	if ops := h.rec.Ops("evt-1"); slices.ContainsFunc(ops, isNack) || countOp(ops, "deliver") != 2 || countOp(ops, "ack") != 1 {
		t.Errorf("evt-1's deliveries: %v; want two, the first let go unsettled, the second acknowledged, none handed back", ops)
	}
	if ops := h.rec.Ops("evt-2"); slices.ContainsFunc(ops, isNack) || countOp(ops, "deliver") != 1 {
		t.Errorf("evt-2's deliveries: %v; want one, not handed back", ops)
	}
}

// A stale head without a message ID, de-duplicated by an event ID in its
// payload, whose later delivery the consumer already holds behind the
// key's next message, is recognised in that delivery by its dedup key, as
// one with an ID is by its ID, and replaced by it at the head of the key:
// the next message is neither handed back nor applied before it.
func TestStaleHeadWithoutMessageIDsLaterDeliveryTakesItsPlace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Subscriber = withoutIDs{h.rec}
	cfg.DedupKey = payloadID
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 4
	g := newGate()
	sh := &staleHead{h: h, g: g}
	// The consumer's ask for a fourth delivery says that evt-1's later
	// delivery is in memory, behind evt-2.
	asked, more := h.rec.holdNext(3)
	c, _ := h.start(cfg, sh.handle)
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"))
	waitFor(t, "evt-2 taken behind evt-1", func() bool { return h.rec.Taken() == 2 })
	// evt-1's AckWait ends, and it is delivered again behind evt-2.
	h.clock.Advance(15 * time.Second)
	waitAsked(t, "evt-1 delivered again behind evt-2", asked)
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	more()

	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	sh.appliedInOrder(t, "evt-1", "evt-2")
	if s := c.Stats(); s.Stale != 1 || s.DeadLettered != 0 {
		t.Errorf("Stats = %+v, want 1 stale, none dead-lettered", s)
	}
	if ops := h.rec.Ops("evt-2"); slices.ContainsFunc(ops, isNack) || countOp(ops, "deliver") != 1 {
		t.Errorf("evt-2's deliveries: %v; want one, not handed back", ops)
	}
	if ops := h.rec.Ops("evt-1"); countOp(ops, "ack") != 1 || slices.ContainsFunc(ops, isNack) {
		t.Errorf("evt-1's deliveries: %v; want the first let go unsettled, the second acknowledged", ops)
	}
}

// A message of a key that the consumer has taken from the transport, but
// not yet put behind its key, when the key's head is let go (stale) is
// handed back (Nack, no delay) as the key-mates it holds are: put behind
// the key then, it would be its head and be applied ahead of the stale
// head's next delivery. The reader is held between the two (a busy
// machine, or a DedupKey that takes its time) at evt-2's dedup key.
func TestStaleHeadsKeyMateTakenAsItIsLetGoIsHandedBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 2
	taken, admit := make(chan struct{}), make(chan struct{})
	var takenOnce, admitOnce sync.Once
	cfg.DedupKey = func(m idem.Message) (string, error) {
		if m.ID == "evt-2" {
			takenOnce.Do(func() {
				close(taken)
				<-admit
			})
		}
		return m.ID, nil
	}
	g := newGate()
	sh := &staleHead{h: h, g: g}
	c, _ := h.start(cfg, sh.handle)
	t.Cleanup(func() { admitOnce.Do(func() { close(admit) }) })
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"))
	select {
	case <-taken:
	case <-time.After(waitLimit):
		t.Fatalf("evt-2 not taken within %s", waitLimit)
	}
	// evt-1's AckWait ended 5s ago: it is let go while the reader holds
	// evt-2, not yet behind it.
	h.clock.Advance(15 * time.Second)
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	admitOnce.Do(func() { close(admit) })

	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	sh.appliedInOrder(t, "evt-1", "evt-2")
	if ops := h.rec.Ops("evt-2"); len(ops) < 2 || ops[0] != "deliver" || ops[1] != "nack 0s" || countOp(ops, "deliver") != 2 {
		t.Errorf("evt-2's deliveries: %v; want the first handed back (nack 0s), then delivered again", ops)
	}
	if ops := h.rec.Ops("evt-1"); countOp(ops, "deliver") != 2 || countOp(ops, "ack") != 1 || slices.ContainsFunc(ops, isNack) {
		t.Errorf("evt-1's deliveries: %v; want the first let go unsettled, the second acknowledged", ops)
	}
}

// The stale head's own later delivery, taken from the transport but not
// yet put in memory when the head is let go, is not handed back: it is the
// head of its key again, recognised (without a message ID) by its dedup
// key, and applied before the key-mate handed back with the head.
func TestStaleHeadsLaterDeliveryTakenAsItIsLetGoIsItsKeysHead(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Subscriber = withoutIDs{h.rec}
	cfg.AckWait = staleAckWait
	cfg.Concurrency, cfg.MaxPending = 1, 3
	taken, admit := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var seen int
	var admitOnce sync.Once
	cfg.DedupKey = func(m idem.Message) (string, error) {
		id, err := payloadID(m)
		if id == "evt-1" {
			mu.Lock()
			seen++
			again := seen == 2
			mu.Unlock()
			if again {
				close(taken)
				<-admit
			}
		}
		return id, err
	}
	g := newGate()
	sh := &staleHead{h: h, g: g}
	c, _ := h.start(cfg, sh.handle)
	t.Cleanup(func() { admitOnce.Do(func() { close(admit) }) })
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's handler")
	h.clock.Advance(20 * time.Second)
	h.publish(msg("evt-2", "acct-1"))
	waitFor(t, "evt-2 taken behind evt-1", func() bool { return h.rec.Taken() == 2 })
	// evt-1's AckWait ends, and the reader takes it again, not yet behind
	// evt-2; evt-2 is in memory, since the reader took more after it.
	h.clock.Advance(15 * time.Second)
	select {
	case <-taken:
	case <-time.After(waitLimit):
		t.Fatalf("evt-1 not taken again within %s", waitLimit)
	}
	g.release()
	waitFor(t, "evt-1 let go", func() bool { return c.Stats().Stale == 1 })
	admitOnce.Do(func() { close(admit) })

	waitFor(t, "both messages processed", func() bool { return c.Stats().Processed == 2 })
	sh.appliedInOrder(t, "evt-1", "evt-2")
	if ops := h.rec.Ops("evt-1"); countOp(ops, "deliver") != 2 || countOp(ops, "ack") != 1 || slices.ContainsFunc(ops, isNack) {
		t.Errorf("evt-1's deliveries: %v; want two, the first let go unsettled, the second acknowledged, none handed back", ops)
	}
	if ops := h.rec.Ops("evt-2"); len(ops) < 2 || ops[1] != "nack 0s" {
		t.Errorf("evt-2's deliveries: %v; want the first handed back (nack 0s) with evt-1", ops)
	}
}

// perDelivery wraps a Subscriber and writes down, for each delivery of the
// streams it opens (by its message ID and attempt: the in-memory transport
// numbers a message's deliveries one by one), how often InProgress was asked, how often before its first
// stale answer, and what its Ack answered. It hands out no batches.
type perDelivery struct {
	idem.Subscriber
	// refuse, when set, answers each delivery's first InProgress, which
	// does not reach the transport.
	refuse error

	mu sync.Mutex
	ds map[deliveryName]*deliveryCalls
}

type deliveryName struct {
	id      string
	attempt int
}

type deliveryCalls struct {
	inProgress int   // InProgress calls
	renewed    int   // InProgress calls up to its first stale answer, that one included
	stale      bool  // an InProgress was answered stale
	acked      bool  // Ack was called
	ackErr     error // what Ack answered
}

func (p *perDelivery) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	s, err := p.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &perDeliveryStream{Stream: s, p: p}, nil
}

// calls returns a copy of what was written down of message id's delivery
// whose attempt is n.
func (p *perDelivery) calls(id string, n int) deliveryCalls {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.ds[deliveryName{id, n}]; c != nil {
		return *c
	}
	return deliveryCalls{}
}

type perDeliveryStream struct {
	idem.Stream
	p *perDelivery
}

func (s *perDeliveryStream) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if s.p.ds == nil {
		s.p.ds = make(map[deliveryName]*deliveryCalls)
	}
	c := &deliveryCalls{}
	s.p.ds[deliveryName{d.Message().ID, d.Attempt()}] = c
	return &perDeliveryDelivery{Delivery: d, p: s.p, c: c}, nil
}

type perDeliveryDelivery struct {
	idem.Delivery
	p *perDelivery
	c *deliveryCalls
}

func (d *perDeliveryDelivery) InProgress(ctx context.Context) error {
	d.p.mu.Lock()
	err := d.p.refuse
	first := d.c.inProgress == 0
	d.p.mu.Unlock()
	if err == nil || !first {
		err = d.Delivery.InProgress(ctx)
	}
	d.p.mu.Lock()
	defer d.p.mu.Unlock()
	d.c.inProgress++
	if !d.c.stale {
		d.c.renewed++
		d.c.stale = errors.Is(err, idem.ErrStaleDelivery)
	}
	return err
}

func (d *perDeliveryDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	d.p.mu.Lock()
	defer d.p.mu.Unlock()
	d.c.acked, d.c.ackErr = true, err
	return err
}

// countingInbox counts the inbox transactions that de-duplicate one
// message (its dedup key is its ID), in both the one-message and the batch
// paths.
type countingInbox struct {
	*idemmem.Inbox
	id string
	n  atomic.Int64
}

func (i *countingInbox) Process(ctx context.Context, consumer, dedupKey string, fn func(context.Context) error) error {
	if dedupKey == i.id {
		i.n.Add(1)
	}
	return i.Inbox.Process(ctx, consumer, dedupKey, fn)
}

func (i *countingInbox) ProcessBatch(ctx context.Context, consumer string, keys []string, fn func(context.Context, []bool) error) error {
	if slices.Contains(keys, i.id) {
		i.n.Add(1)
	}
	return i.Inbox.ProcessBatch(ctx, consumer, keys, fn)
}

// A keyed message whose handling outlasts its AckWait, with the heartbeat
// late each time (a loaded machine), is handed out again and again: each
// later delivery queues behind the earlier ones, which the heartbeat finds
// stale. The heartbeat renews a delivery no more once the transport has
// refused it as stale (the refusal is for good), and a stale delivery that
// comes to the head of its key with a later delivery of its message behind
// it is let go unhandled (Stats.Stale): the later delivery takes the head
// at once. Were each stale copy handled in turn, each would take an inbox
// transaction and an acknowledgement the transport refuses, and under load
// the live delivery's own AckWait could end before it reached the head:
// then no delivery of the key is ever acknowledged.
func TestStaleCopiesAtTheHeadAreLetGoForTheLiveDelivery(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	sub := &perDelivery{Subscriber: h.tr}
	h.rec.Subscriber = sub
	inbox := &countingInbox{Inbox: h.inbox, id: "evt-1"}
	cfg := h.config()
	const ackWait, beat, copies = time.Second, 250 * time.Millisecond, 3
	cfg.AckWait, cfg.Concurrency, cfg.Inbox = ackWait, 1, inbox
	g := newGate()
	var calls atomic.Int64
	asked, more := h.rec.holdNext(1)
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		calls.Add(1)
		g.hold()
		return h.apply(ctx, m)
	})
	// Registered after the consumer's stop, so run before it.
	release := sync.OnceFunc(g.release)
	t.Cleanup(release)
	t.Cleanup(func() { more() })
	waitFor(t, "the heartbeat waiting for its first beat", func() bool { return h.timers.Pending(beat) == 1 })
	h.publish(msg("evt-1", "acct-1"))
	g.wait(t, "evt-1's first handler")
	waitAsked(t, "evt-1's first delivery in memory", asked)

	for i := 1; i <= copies; i++ {
		// The latest delivery's AckWait ends before the beat that would
		// renew it comes: the transport hands the message out again.
		h.clock.Advance(ackWait)
		asked, next := h.rec.holdNext(i + 1)
		more()
		more = next
		waitAsked(t, fmt.Sprintf("evt-1's delivery %d in memory", i+1), asked)
		// The late beat finds delivery i stale.
		h.timers.Advance(0)
		waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	}
	// evt-2, of another key, is ready before evt-1's next delivery: with
	// batches, that one is taken from the ready entries by evt-2's batch
	// (gather), not by a worker on its own.
	asked, next := h.rec.holdNext(copies + 2)
	more()
	more = next
	h.publish(msg("evt-2", "acct-2"))
	waitAsked(t, "evt-2 in memory", asked)
	// A beat in time: the live delivery is renewed.
	h.timers.Advance(beat)
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	if dc := sub.calls("evt-1", copies+1); dc.inProgress != 1 || dc.stale {
		t.Fatalf("the live delivery: %+v; want renewed once, as its own", dc)
	}
	release()

	waitFor(t, "every delivery settled or let go", func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.Stale == copies+2
	})
	if n := calls.Load(); n != 2 {
		t.Errorf("handler called %d times, want twice: once for evt-1, once for evt-2", n)
	}
	for _, id := range []string{"evt-1", "evt-2"} {
		if n := h.applied.Get(id); n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	if n := inbox.n.Load(); n != 2 {
		t.Errorf("%d inbox transactions for evt-1, want 2 (its first delivery's, the live one's): one per stale copy", n)
	}
	if s := c.Stats(); s.Processed != 2 || s.Duplicates != 1 || s.Stale != copies-1 {
		t.Errorf("Stats = %+v; want 2 processed, 1 duplicate (evt-1's live delivery), %d stale (evt-1's copies let go)", s, copies-1)
	}
	if dc := sub.calls("evt-1", copies+1); !dc.acked || dc.ackErr != nil {
		t.Errorf("the live delivery: %+v; want acknowledged, the transport taking it", dc)
	}
	for n := 1; n <= copies; n++ {
		dc := sub.calls("evt-1", n)
		if !dc.stale {
			t.Errorf("delivery %d: %+v; want found stale by the heartbeat", n, dc)
		}
		if dc.inProgress != dc.renewed {
			t.Errorf("delivery %d: InProgress asked %d times, %d of them after the transport refused it as stale; want none after",
				n, dc.inProgress, dc.inProgress-dc.renewed)
		}
	}
}

// A stale delivery behind its key's head, superseded by a later delivery of
// its message, does not join the head's batch: it comes to the head and is
// let go there, as it would be taken alone, and the message's only inbox
// transaction is its live delivery's.
func TestStaleFollowerIsNotJoinedToABatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inbox := &countingInbox{Inbox: h.inbox, id: "evt-1"}
	cfg := h.config()
	const ackWait, beat = time.Second, 250 * time.Millisecond
	cfg.AckWait, cfg.Concurrency, cfg.Inbox = ackWait, 1, inbox
	g := newGate()
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "x" {
			g.hold()
		}
		return h.apply(ctx, m)
	})
	release := sync.OnceFunc(g.release)
	t.Cleanup(release)
	waitFor(t, "the heartbeat waiting for its first beat", func() bool { return h.timers.Pending(beat) == 1 })
	asked, more := h.rec.holdNext(3)
	t.Cleanup(func() { more() })
	h.publish(msg("x", "K"))
	g.wait(t, "x's handler")
	h.publish(msg("h", "K"), msg("evt-1", "K"))
	waitAsked(t, "h and evt-1 in memory behind x", asked)
	h.clock.Advance(ackWait)
	asked, next := h.rec.holdNext(6)
	more()
	more = next
	waitAsked(t, "the copies in memory", asked)
	h.timers.Advance(0)
	waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
	release()
	waitFor(t, "every delivery settled or let go", func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.Stale == 6
	})
	if n := inbox.n.Load(); n != 1 {
		t.Errorf("%d inbox transactions for evt-1, want 1 (its live delivery's); stats %+v; ops %v", n, c.Stats(), h.rec.Ops("evt-1"))
	}
	if s := c.Stats(); s.Stale != 2 {
		t.Errorf("stats %+v, want h's and evt-1's stale deliveries let go", s)
	}
}
