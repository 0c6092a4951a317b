package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// outcomes records the outcomes a consumer's Observer sees, and calls
// first once, with the first outcome that is not a retry.
type outcomes struct {
	mu    sync.Mutex
	seen  []consumer.Outcome
	first func(consumer.Outcome)
}

func (o *outcomes) Begin(ctx context.Context, _ consumer.Event) context.Context { return ctx }

func (o *outcomes) End(_ context.Context, e consumer.Event) {
	o.mu.Lock()
	o.seen = append(o.seen, e.Outcome)
	first := o.first
	if e.Outcome != consumer.OutcomeRetried {
		o.first = nil
	}
	o.mu.Unlock()
	if first != nil && e.Outcome != consumer.OutcomeRetried {
		first(e.Outcome)
	}
}

func (o *outcomes) list() []consumer.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]consumer.Outcome(nil), o.seen...)
}

// A consumer whose delivery's lease ended while its message waited for a
// retry (a stalled process, a retry delay longer than the AckWait) no
// longer holds the message: the transport gives it to the next delivery.
// When its retry comes, the consumer lets it go instead of retrying it,
// and never dead-letters it, though its attempts ran out: a dead letter
// would hold its key back, and the next delivery would be parked instead
// of applied. The next delivery applies it, once.
func TestExpiredLeaseIsLetGo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, db, clock)
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}

	// The handler fails until the stale delivery has an outcome; then the
	// next delivery's attempt succeeds.
	var failing atomic.Bool
	failing.Store(true)
	var calls, applied atomic.Int64
	handler := func(ctx context.Context, m idem.Message) error {
		calls.Add(1)
		if failing.Load() {
			return idem.RetryAfter(errors.New("the card network is down"), time.Hour)
		}
		applied.Add(1)
		return nil
	}
	staleOutcome := make(chan consumer.Outcome, 1)
	obs := &outcomes{first: func(o consumer.Outcome) {
		failing.Store(false)
		staleOutcome <- o
	}}
	const ackWait = 30 * time.Second
	c, err := consumer.New(&consumer.Config{
		Name: "settlement", Topic: "payments", Subscriber: tr,
		Inbox: inbox, DeadLetters: letters, Ledger: ledger,
		InTx: func(ctx context.Context, fn func(context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
		Retry:      idem.RetryPolicy{MaxAttempts: 2},
		AckWait:    ackWait,
		Clock:      clock,
		Timers:     clock,
		Observer:   obs,
		MaxPending: 1, Concurrency: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, handler) }()
	defer func() {
		stop()
		<-done
	}()

	m := idem.Message{ID: "evt-1", Topic: "payments", Key: "acct-1", Payload: []byte("x")}
	if err := tr.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 10*time.Second, "the first attempt failed and its retry scheduled", func() bool {
		return c.Stats().Retried == 1
	})
	// The process stalls past the AckWait: its lease ends, and the retry's
	// hour passes.
	clock.Advance(time.Hour + ackWait)
	var got consumer.Outcome
	select {
	case got = <-staleOutcome:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stale delivery had no outcome; outcomes %v", obs.list())
	}
	if got == consumer.OutcomeDeadLettered {
		t.Errorf("the delivery whose lease ended was dead-lettered; want it let go (outcome %q)", consumer.OutcomeStale)
	}
	// Waited for on the counts, which the consumer makes once the transport
	// is told (the handler's own count comes before its commit): the stale
	// delivery's count too, which may come after the next delivery began.
	idemtest.Eventually(t, 10*time.Second, "the stale delivery counted, the next one applied the message", func() bool {
		s := c.Stats()
		return s.Processed >= 1 && s.Stale >= 1
	})
	if n := applied.Load(); n != 1 {
		t.Errorf("applied %d times, want once", n)
	}
	dls, err := letters.List(ctx, idem.DeadLetterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 0 {
		t.Errorf("%d dead letters, want none: %+v", len(dls), dls[0].Attempts)
	}
	if _, held, err := ledger.HeldBack(ctx, "settlement", "acct-1"); err != nil || held {
		t.Errorf("HeldBack(acct-1) = %v, %v; want the key not held", held, err)
	}
	if s := c.Stats(); s.Stale != 1 || s.DeadLettered != 0 || s.Processed != 1 {
		t.Errorf("Stats = %+v, want 1 stale, 1 processed, none dead-lettered", s)
	}
	t.Logf("handler calls %d, outcomes %v", calls.Load(), obs.list())
}
