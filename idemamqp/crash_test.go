package idemamqp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// A message that crashes its consumer past the queue's delivery limit, so
// that the consumer never records an outcome, reaches the consumer from
// "<queue>.limit" counted as exhausted: its next failure dead-letters it
// at once, with the broker's count, and it leaves the broker.
func TestCrashingMessageDeadLettered(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemamqp.Config{DeliveryLimit: 2})
	sub := idem.Subscription{Topic: "orders", Consumer: "settlement"}
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "orders", Key: "acct-1"}); err != nil {
		t.Fatal(err)
	}
	// Three crashes: the stream holding the delivery goes away unsettled.
	// (No stream is left open after the last, whose prefetch would count
	// one more delivery.)
	for crash := 1; crash <= 3; crash++ {
		next(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if crash == 3 {
			break
		}
		if s, err = tr.Subscribe(t.Context(), sub); err != nil {
			t.Fatal(err)
		}
	}

	dead := idemmem.NewDeadLetters(nil)
	c, err := consumer.New(&consumer.Config{
		Name: "settlement", Topic: "orders", Subscriber: tr,
		Inbox: idemmem.NewInbox(), DeadLetters: dead, Ledger: idemmem.NewLedger(), InTx: idemmem.Transact,
		Retry: idem.RetryPolicy{MaxAttempts: 4, Base: time.Millisecond, Cap: time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	handled := make(chan int, 10)
	go func() {
		ran <- c.Run(ctx, func(ctx context.Context, m idem.Message) error {
			info, _ := consumer.InfoFromContext(ctx)
			handled <- info.Attempt
			return errors.New("still failing")
		})
	}()
	defer func() {
		cancel()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	var letters []idem.DeadLetter
	idemtest.Eventually(t, 10*time.Second, "the message to be dead-lettered", func() bool {
		letters, err = dead.List(t.Context(), idem.DeadLetterFilter{Consumer: "settlement"})
		return err == nil && len(letters) > 0
	})
	l := letters[0]
	if l.Message.ID != "m1" || l.Message.Topic != "orders" || l.Class != idem.DeadExhausted {
		t.Errorf("dead letter = %s %s %s, want m1 orders exhausted", l.Message.ID, l.Message.Topic, l.Class)
	}
	if n := len(l.Attempts); n == 0 || l.Attempts[n-1].Number != 4 {
		t.Errorf("dead letter's attempts = %+v, want the last numbered 4 (three crashes, then this one)", l.Attempts)
	}
	if got := <-handled; got != 4 {
		t.Errorf("the handler ran as attempt %d, want 4", got)
	}
	select {
	case n := <-handled:
		t.Errorf("the handler ran again, as attempt %d", n)
	default:
	}
	idemtest.Eventually(t, 10*time.Second, "both queues to be empty", func() bool {
		return queueDepth(t, tr.Queue("settlement")) == 0 && queueDepth(t, tr.Queue("settlement")+".limit") == 0
	})
}
