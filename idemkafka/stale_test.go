package idemkafka_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// firstOutcomes records, per message, the first outcome of a consumer's
// handling that is not a retry.
type firstOutcomes struct {
	mu  sync.Mutex
	got map[string]consumer.Outcome
}

func (o *firstOutcomes) Begin(ctx context.Context, _ consumer.Event) context.Context { return ctx }

func (o *firstOutcomes) End(_ context.Context, e consumer.Event) {
	if e.Outcome == consumer.OutcomeRetried {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.got[e.Message.ID]; !ok {
		o.got[e.Message.ID] = e.Outcome
	}
}

func (o *firstOutcomes) of(id string) (consumer.Outcome, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out, ok := o.got[id]
	return out, ok
}

// heldSubscriber holds back every delivery of its streams until open is
// closed, and says which messages it holds.
type heldSubscriber struct {
	idem.Subscriber
	open chan struct{}
	mu   sync.Mutex
	ids  []string
}

func (s *heldSubscriber) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	st, err := s.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &heldStream{Stream: st, s: s}, nil
}

func (s *heldSubscriber) held() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids)
}

type heldStream struct {
	idem.Stream
	s *heldSubscriber
}

func (h *heldStream) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := h.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	h.s.mu.Lock()
	h.s.ids = append(h.s.ids, d.Message().ID)
	h.s.mu.Unlock()
	select {
	case <-h.s.open:
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A consumer whose handler keeps failing a record while a rebalance moves
// the record's partition to another consumer does not dead-letter it when
// its attempts run out: the record is the new owner's, which applies it,
// once. (Dead-lettered, it would also hold its key back, and the new owner
// would park the record instead of applying it.) The record of the
// partition the first consumer keeps is dead-lettered by it as before.
func TestRebalanceDuringRetriesDeadLettersNothingMoved(t *testing.T) {
	t.Parallel()
	const topic = "payments.succeeded"
	ctx := t.Context()
	seeds := startKafka(t)
	pub := open(t, seeds, idemkafka.Config{Partitions: 2})
	if err := pub.EnsureTopics(ctx, topic); err != nil {
		t.Fatal(err)
	}
	// One record on each partition, so that whichever the rebalance moves
	// holds one.
	raw, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"evt-p0", "evt-p1"}
	for p, id := range ids {
		r := &kgo.Record{Topic: topic, Partition: int32(p), Key: []byte(id), Value: []byte("x"),
			Headers: []kgo.RecordHeader{{Key: idemkafka.HeaderID, Value: []byte(id)}}}
		if err := raw.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	raw.Close()

	stores := consumer.Config{
		Inbox: idemmem.NewInbox(), DeadLetters: idemmem.NewDeadLetters(nil), Ledger: idemmem.NewLedger(),
		InTx:  idemmem.Transact,
		Retry: idem.RetryPolicy{MaxAttempts: 2},
	}
	cfg := idemkafka.Config{SessionTimeout: time.Second, RevokeWait: 300 * time.Millisecond, CommitInterval: 50 * time.Millisecond}

	// The first consumer fails every attempt and waits an hour between
	// them, on a clock the test moves.
	clock := idemmem.NewClock(idemtest.Start)
	first := stores
	first.Clock, first.Timers = clock, clock
	firstSeen := &firstOutcomes{got: make(map[string]consumer.Outcome)}
	first.Observer = firstSeen
	var firstCalls atomic.Int64
	a := startRunner(t, seeds, cfg, topic, first, func(context.Context, idem.Message) error {
		firstCalls.Add(1)
		return idem.RetryAfter(errors.New("the card network is down"), time.Hour)
	})
	idemtest.Eventually(t, 30*time.Second, "both records' first attempts failed", func() bool {
		return a.c.Stats().Retried == 2
	})

	// The second consumer joins: the rebalance moves one partition to it,
	// whose record it takes but, held back by the test, does not apply yet.
	var mu sync.Mutex
	applied := make(map[string]int)
	sub := &heldSubscriber{open: make(chan struct{})}
	second := stores
	second.Subscriber = sub
	trB := open(t, seeds, cfg)
	sub.Subscriber = trB
	second.Name, second.Topic = "settlement", topic
	cb, err := consumer.New(&second)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cb.Run(runCtx, func(ctx context.Context, m idem.Message) error {
			tx, _ := idemmem.TxFromContext(ctx)
			return tx.OnCommit(func() {
				mu.Lock()
				defer mu.Unlock()
				applied[m.ID]++
			})
		})
	}()
	defer func() {
		stop()
		<-done
	}()
	idemtest.Eventually(t, 30*time.Second, "the second consumer given a record of the moved partition", func() bool {
		return len(sub.held()) > 0
	})

	// The first consumer's retries come, and fail: its attempts have run
	// out.
	idemtest.Eventually(t, 30*time.Second, "the first consumer's last attempts", func() bool {
		clock.Advance(time.Hour)
		_, p0 := firstSeen.of(ids[0])
		_, p1 := firstSeen.of(ids[1])
		return p0 && p1
	})

	// The record the second consumer applies is the moved one. (Which
	// partition moves is the group's choice, and a group still settling
	// may hand a partition to the second consumer and take it back.)
	close(sub.open)
	var moved string
	idemtest.Eventually(t, 30*time.Second, "the new owner applied the moved record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range applied {
			moved = id
		}
		return moved != ""
	})
	if out, _ := firstSeen.of(moved); out == consumer.OutcomeDeadLettered {
		t.Errorf("the record of the partition moved away (%s) was dead-lettered by its old owner; want it let go (%q)", moved, consumer.OutcomeStale)
	}
	mu.Lock()
	if n := applied[moved]; n != 1 || len(applied) != 1 {
		t.Errorf("applied %v, want %s once and nothing else", applied, moved)
	}
	mu.Unlock()
	dls, err := stores.DeadLetters.List(ctx, idem.DeadLetterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dl := range dls {
		if dl.Message.ID == moved {
			t.Errorf("%s, whose partition moved, is in the dead letters", moved)
		}
	}
	t.Logf("moved %s; first consumer %+v (%d handler calls), second %+v", moved, a.c.Stats(), firstCalls.Load(), cb.Stats())
}
