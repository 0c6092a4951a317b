package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// A keyed message that keeps failing stays at the head of its partition,
// retried in the consumer's memory, while the thousands behind it (other
// keys) are applied: the stream holds no more than the consumer's
// MaxPending all along, the partition's position stays at the failing
// message (StreamStats tells an operator so), and once it succeeds the
// position moves past everything.
func TestPoisonAtAPartitionsHead(t *testing.T) {
	t.Parallel()
	const n, pending, topic = 3000, 40, "payments.succeeded"
	seeds := startKafka(t)
	cfg := idemkafka.Config{Partitions: 1, CommitInterval: 20 * time.Millisecond}
	tr := open(t, seeds, cfg)
	perKey := map[string]int{"poison": 1}
	msgs := []idem.Message{{ID: "evt-poison", Topic: topic, Key: "poison", Headers: map[string]string{"Seq": "1"}}}
	for i := range n {
		key := fmt.Sprintf("acct-%02d", i%50)
		perKey[key]++
		msgs = append(msgs, idem.Message{ID: fmt.Sprintf("evt-%05d", i), Topic: topic, Key: key, Payload: make([]byte, 200),
			Headers: map[string]string{"Seq": strconv.Itoa(perKey[key])}})
	}
	for i := 0; i < len(msgs); i += 500 {
		if err := tr.Publish(t.Context(), msgs[i:min(i+500, len(msgs))]...); err != nil {
			t.Fatal(err)
		}
	}
	var fx effects
	var failing atomic.Bool
	failing.Store(true)
	c, err := consumer.New(&consumer.Config{
		Name: "settlement", Topic: topic, Subscriber: tr,
		Inbox: idemmem.NewInbox(), DeadLetters: idemmem.NewDeadLetters(nil), Ledger: idemmem.NewLedger(), InTx: idemmem.Transact,
		MaxPending: pending, BatchSize: 10,
		Retry: idem.RetryPolicy{MaxAttempts: 100_000, Base: 5 * time.Millisecond, Cap: 10 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(ctx context.Context, m idem.Message) error {
			if m.Key == "poison" && failing.Load() {
				return errors.New("the account is locked, for now")
			}
			return fx.apply(ctx, m)
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	idemtest.Eventually(t, 60*time.Second, "every message behind the failing one applied", func() bool { return fx.count() >= n })
	st := tr.StreamStats("settlement")
	if st.HeldPeak > pending || st.Limit != pending || st.Held > pending {
		t.Errorf("held %d (peak %d) against a limit of %d (MaxPending %d)", st.Held, st.HeldPeak, st.Limit, pending)
	}
	if st.Uncommitted < n || st.OldestHeld.IsZero() || st.HeldBytes <= 0 {
		t.Errorf("with a failing message at the head: %+v; want %d or more uncommitted, and the oldest held dated", st, n)
	}
	t.Logf("pinned: %+v", st)
	failing.Store(false)
	idemtest.Eventually(t, 30*time.Second, "the failing message applied, and the position past everything", func() bool {
		st := tr.StreamStats("settlement")
		return fx.count() == n+1 && st.Uncommitted == 0 && st.Held == 0
	})
	fx.check(t, perKey)
}
