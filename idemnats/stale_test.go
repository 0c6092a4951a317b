package idemnats_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idemtest"
)

// lossySubscriber loses the in-progress heartbeats of the first delivery
// of one message until heard is closed, as a network that drops them
// would, and records the IDs its streams hand out and the calls of Next
// that follow each.
type lossySubscriber struct {
	idem.Subscriber
	lose  string
	heard chan struct{}

	mu     sync.Mutex
	seen   []string
	nexts  int // calls of Next
	losing bool
}

func (s *lossySubscriber) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	st, err := s.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &lossyStream{Stream: st, s: s}, nil
}

// handedOut returns the IDs handed out, and whether Next was called again
// after the last of them, so that the consumer holds it.
func (s *lossySubscriber) handedOut() ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen), s.nexts > len(s.seen)
}

type lossyStream struct {
	idem.Stream
	s *lossySubscriber
}

func (l *lossyStream) Next(ctx context.Context) (idem.Delivery, error) {
	l.s.mu.Lock()
	l.s.nexts++
	l.s.mu.Unlock()
	d, err := l.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.seen = append(l.s.seen, d.Message().ID)
	if d.Message().ID != l.s.lose || l.s.losing {
		return d, nil
	}
	l.s.losing = true
	return &lossyDelivery{Delivery: d, heard: l.s.heard}, nil
}

type lossyDelivery struct {
	idem.Delivery
	heard chan struct{}
}

func (d *lossyDelivery) InProgress(ctx context.Context) error {
	select {
	case <-d.heard:
		return d.Delivery.InProgress(ctx)
	default:
		return nil // lost on its way
	}
}

// A key's head whose AckWait ended (its heartbeats were lost) is delivered
// again to the same stream, behind its key's next message; when its
// handling then fails for good, the consumer finds it stale and lets it
// go. Its later delivery, which the consumer holds, takes its place: the
// key's next message must not overtake it. (Handed back with its key-mates
// in the order the consumer held them, the next message was NAKed before
// it, and JetStream delivered them again in that order.)
func TestStaleHeadKeepsItsKeysOrder(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	tr := newIsolated(t, idemnats.Config{})
	ctx := t.Context()

	sub := &lossySubscriber{Subscriber: tr, lose: "m1", heard: make(chan struct{})}
	var mu sync.Mutex
	var applied []string
	calls := make(map[string]int)
	release := make(chan struct{})
	cfg := consumer.Config{
		Name: "c", Topic: topic, Subscriber: sub,
		Inbox: idemmem.NewInbox(), DeadLetters: idemmem.NewDeadLetters(nil), Ledger: idemmem.NewLedger(),
		InTx:            idemmem.Transact,
		AfterDeadLetter: consumer.LetThrough,
		AckWait:         2 * time.Second,
		BatchSize:       1,
	}
	c, err := consumer.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(runCtx, func(ctx context.Context, m idem.Message) error {
			mu.Lock()
			calls[m.ID]++
			n := calls[m.ID]
			mu.Unlock()
			if m.ID == "m1" && n == 1 {
				// The first attempt outlasts the AckWait, and fails for
				// good.
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				return idem.Permanent(errors.New("the ledger entry is malformed"))
			}
			tx, _ := idemmem.TxFromContext(ctx)
			return tx.OnCommit(func() {
				mu.Lock()
				defer mu.Unlock()
				applied = append(applied, m.ID)
			})
		})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	if err := tr.Publish(ctx,
		idem.Message{ID: "m1", Topic: topic, Key: "k"},
		idem.Message{ID: "m2", Topic: topic, Key: "k"},
	); err != nil {
		t.Fatal(err)
	}
	// m1's AckWait ends (m2's heartbeats keep it), and JetStream delivers
	// it again, to this stream, behind m2.
	idemtest.Eventually(t, 30*time.Second, "m1 delivered again, behind m2, and held by the consumer", func() bool {
		// m2's AckWait may end too on a loaded machine (a heartbeat
		// late), and its later delivery follow: the order to keep is the
		// same.
		ids, held := sub.handedOut()
		return held && len(ids) >= 3 && slices.Equal(ids[:3], []string{"m1", "m2", "m1"})
	})
	close(sub.heard)
	close(release)

	idemtest.Eventually(t, 30*time.Second, "both messages applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == 2
	})
	mu.Lock()
	got := slices.Clone(applied)
	mu.Unlock()
	if !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("key k applied in the order %v, want [m1 m2]", got)
	}
	if st := c.Stats(); st.Stale != 1 || st.DeadLettered != 0 {
		t.Errorf("Stats = %+v, want Stale 1 (m1's first delivery let go) and nothing dead-lettered", st)
	}
	dls, err := cfg.DeadLetters.List(ctx, idem.DeadLetterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 0 {
		t.Errorf("dead letters: %d, want none: m1's stale delivery was not its own to dead-letter", len(dls))
	}
}
