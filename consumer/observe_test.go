package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/eventually"
)

// tally is an Observer that counts outcomes and checks that every
// handling it saw begin ends once.
type tally struct {
	mu       sync.Mutex
	next     int
	open     map[int]bool
	outcomes map[consumer.Outcome]int
	problems []string
	lagged   int
}

type handlingKey struct{}

func (o *tally) Begin(ctx context.Context, e consumer.Event) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.next++
	o.open[o.next] = true
	if e.Consumer != "audit" || e.Topic != "t" || e.Attempt < 1 {
		o.problems = append(o.problems, fmt.Sprintf("Begin(%+v)", e))
	}
	return context.WithValue(ctx, handlingKey{}, o.next)
}

func (o *tally) End(ctx context.Context, e consumer.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	id, _ := ctx.Value(handlingKey{}).(int)
	if !o.open[id] {
		o.problems = append(o.problems, fmt.Sprintf("End of handling %d, not open: %+v", id, e))
	}
	delete(o.open, id)
	o.outcomes[e.Outcome]++
	if e.Outcome == consumer.OutcomeProcessed && e.Lag > 0 {
		o.lagged++
	}
	if (e.Outcome == consumer.OutcomeRetried || e.Outcome == consumer.OutcomeDeadLettered) && e.Err == nil {
		o.problems = append(o.problems, fmt.Sprintf("%s without its error", e.Outcome))
	}
}

// The observer sees every delivery's handling end once, with the outcome
// Stats counts, whether messages are handled in batches or one at a time,
// and a Handler runs in the context Begin returned.
func TestObserverSeesOutcomes(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			o := &tally{open: map[int]bool{}, outcomes: map[consumer.Outcome]int{}}
			transport := idemmem.NewTransport(nil)
			defer transport.Close()
			c, err := consumer.New(&consumer.Config{
				Name: "audit", Topic: "t", Subscriber: transport, Inbox: idemmem.NewInbox(),
				DeadLetters: idemmem.NewDeadLetters(nil), Ledger: idemmem.NewLedger(), BatchSize: batch,
				Retry:    idem.RetryPolicy{MaxAttempts: 2, Base: time.Millisecond, Cap: time.Millisecond},
				Observer: o,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			wg.Go(func() {
				c.Run(ctx, func(ctx context.Context, m idem.Message) error {
					if _, ok := ctx.Value(handlingKey{}).(int); !ok && batch == 1 {
						t.Error("the handler's context is not the observer's")
					}
					if m.ID == "bad-1" || m.ID == "bad-2" {
						return errors.New("refused")
					}
					return nil
				})
			})
			<-c.Subscribed()
			var msgs []idem.Message
			for i := range 30 {
				msgs = append(msgs, idem.Message{ID: fmt.Sprintf("m-%d", i), Topic: "t", Key: fmt.Sprintf("k%d", i%3), Time: time.Now()})
			}
			msgs = append(msgs, idem.Message{ID: "bad-1", Topic: "t", Key: "k0"}, idem.Message{ID: "bad-2", Topic: "t"},
				idem.Message{ID: "m-1", Topic: "t"}, idem.Message{ID: "m-behind", Topic: "t", Key: "k0"})
			if err := transport.Publish(t.Context(), msgs...); err != nil {
				t.Fatal(err)
			}
			settled := func() bool {
				s := c.Stats()
				return s.Processed == 30 && s.Duplicates == 1 && s.DeadLettered == 2 && s.Parked == 1
			}
			eventually.True(t, 10*time.Second, "every message settled", settled)
			cancel()
			wg.Wait()
			s := c.Stats()
			o.mu.Lock()
			defer o.mu.Unlock()
			for _, p := range o.problems {
				t.Error(p)
			}
			if len(o.open) != 0 {
				t.Errorf("%d handlings never ended", len(o.open))
			}
			for out, n := range map[consumer.Outcome]int64{
				consumer.OutcomeProcessed: s.Processed, consumer.OutcomeDuplicate: s.Duplicates,
				consumer.OutcomeRetried: s.Retried, consumer.OutcomeDeadLettered: s.DeadLettered, consumer.OutcomeParked: s.Parked,
			} {
				if int64(o.outcomes[out]) != n {
					t.Errorf("observed %d %s, Stats counts %d", o.outcomes[out], out, n)
				}
			}
			if o.lagged != 30 {
				t.Errorf("%d messages processed with a lag, want the 30 with a Time", o.lagged)
			}
		})
	}
}

// A message handled alone in batch mode (a batch of one) runs in the
// context the Observer's Begin returned, as in one-at-a-time mode, so that
// its span holds the handler's own spans.
func TestObserverContextReachesABatchOfOne(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	o := &tally{open: map[int]bool{}, outcomes: map[consumer.Outcome]int{}}
	cfg := h.config()
	cfg.Name, cfg.Topic, cfg.Observer, cfg.BatchSize = "audit", "t", o, 20
	var seen sync.Map
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		_, ok := ctx.Value(handlingKey{}).(int)
		seen.Store(m.ID, ok)
		return h.apply(ctx, m)
	})
	<-c.Subscribed()
	h.publish(idem.Message{ID: "alone", Topic: "t"})
	waitFor(t, "the message processed", func() bool { return c.Stats().Processed == 1 })
	if ok, _ := seen.Load("alone"); ok != true {
		t.Error("the handler of a batch of one did not run in the context the observer's Begin returned")
	}
}

// Observers skips nil observers: with none left it is nil, and with one
// left it is that one.
func TestObserversSkipsNil(t *testing.T) {
	t.Parallel()
	if o := consumer.Observers(nil, nil); o != nil {
		t.Errorf("Observers(nil, nil) = %v, want nil", o)
	}
	o := &tally{open: map[int]bool{}, outcomes: map[consumer.Outcome]int{}}
	if got := consumer.Observers(nil, o, nil); got != consumer.Observer(o) {
		t.Errorf("Observers(nil, o, nil) = %v, want o itself", got)
	}
}

// beginLog is an Observer that writes down, per message ID, the attempt
// number of every handling it saw begin and the outcome of every one it
// saw end, and which handlings never ended.
type beginLog struct {
	mu       sync.Mutex
	attempts map[string][]int
	outcomes map[string][]consumer.Outcome
	open     int
}

type beginLogKey struct{}

func newBeginLog() *beginLog {
	return &beginLog{attempts: map[string][]int{}, outcomes: map[string][]consumer.Outcome{}}
}

func (o *beginLog) Begin(ctx context.Context, e consumer.Event) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts[e.Message.ID] = append(o.attempts[e.Message.ID], e.Attempt)
	o.open++
	return context.WithValue(ctx, beginLogKey{}, e.Message.ID)
}

func (o *beginLog) End(ctx context.Context, e consumer.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes[e.Message.ID] = append(o.outcomes[e.Message.ID], e.Outcome)
	o.open--
}

// The Event an Observer's Begin gets numbers the attempt as the handler's
// Info does: a keyed message retried inside the consumer (its delivery's
// own count stays at 1) begins attempts 1, 2 and 3, in one-at-a-time and
// batch modes, so that a trace or a metric keyed on the attempt tells the
// retries from the first try.
func TestObserverEventNumbersRetriesInMemory(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			o := newBeginLog()
			cfg := h.config()
			cfg.Observer, cfg.BatchSize = o, batch
			var calls attemptsCounter
			c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
				if calls.add(ctx, m) < 3 {
					return errFlaky
				}
				return h.apply(ctx, m)
			})
			h.publish(msg("evt-1", "K"))
			h.advanceUntil("evt-1 processed", time.Second, func() bool { return c.Stats().Processed == 1 })
			if got := calls.Seen("evt-1"); !slices.Equal(got, []int{1, 2, 3}) {
				t.Fatalf("the handler's Info.Attempt: %v, want [1 2 3]", got)
			}
			if ops := h.rec.Ops("evt-1"); countOp(ops, "deliver") != 1 {
				t.Fatalf("evt-1's deliveries: %v; want one, retried inside the consumer", ops)
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			if got := o.attempts["evt-1"]; !slices.Equal(got, []int{1, 2, 3}) {
				t.Errorf("Begin's Event.Attempt: %v, want [1 2 3], as the handler's Info", got)
			}
		})
	}
}

// A consumer stopped while handlings are in flight ends each of them for
// its Observer, as interrupted: in batch mode too, where the handling of
// every message of the batch began before the first handler ran, so that
// no span or in-flight gauge of an observer stays open past Run.
func TestObserverSeesInterruptedHandlingsEnd(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			o := newBeginLog()
			cfg := h.config()
			cfg.Observer, cfg.BatchSize, cfg.Concurrency = o, batch, 1
			// Three keys, so that a batch takes all three.
			h.publish(msg("evt-1", "A"), msg("evt-2", "B"), msg("evt-3", "C"))
			started := make(chan struct{})
			var once sync.Once
			c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error {
				once.Do(func() { close(started) })
				<-ctx.Done() // in flight at shutdown
				return ctx.Err()
			})
			// Every delivery held once each has had a heartbeat.
			h.advanceUntil("every delivery held in memory", 30*time.Second/4, func() bool {
				for _, id := range []string{"evt-1", "evt-2", "evt-3"} {
					if !slices.Contains(h.rec.Ops(id), "in-progress") {
						return false
					}
				}
				return true
			})
			select {
			case <-started:
			case <-time.After(waitLimit):
				t.Fatal("no handler started")
			}
			stop()
			if s := c.Stats(); s != (consumer.Stats{}) {
				t.Errorf("Stats = %+v after an interrupted run, want zero", s)
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.open != 0 {
				t.Errorf("%d handlings began and never ended (began: %v, ended: %v)", o.open, o.attempts, o.outcomes)
			}
			for id, outs := range o.outcomes {
				for _, out := range outs {
					if out != consumer.OutcomeInterrupted {
						t.Errorf("%s's handling ended %s, want interrupted", id, out)
					}
				}
			}
			if batch > 1 && len(o.attempts) < 2 {
				t.Errorf("handlings began for %v; want the batch's messages, not one", o.attempts)
			}
		})
	}
}

// In batch mode, a message dropped from a batch because the message ahead
// of it in its key failed (it waits for that one's retry, and may be
// handled by another worker then) has its handling ended for the Observer
// (interrupted) before it is handed on, and a new one begun when it is
// handled: the observer sees each handling begin and end once, and none
// spans the wait behind its key's retry.
func TestObserverSeesADroppedBatchMessageEndAndBeginAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	o := newBeginLog()
	cfg := h.config()
	cfg.Observer, cfg.BatchSize, cfg.Concurrency = o, 10, 1
	h.publish(msg("evt-1", "K"), msg("evt-2", "K"))
	var calls attemptsCounter
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 && m.ID == "evt-1" {
			return errFlaky
		}
		return h.apply(ctx, m)
	})
	h.advanceUntil("both processed", time.Second, func() bool { return c.Stats().Processed == 2 })
	stop()
	if got := calls.Seen("evt-2"); len(got) != 1 {
		t.Fatalf("evt-2's handler ran %d times, want once", len(got))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.open != 0 {
		t.Errorf("%d handlings began and never ended (began: %v, ended: %v)", o.open, o.attempts, o.outcomes)
	}
	if got, want := o.outcomes["evt-1"], []consumer.Outcome{consumer.OutcomeRetried, consumer.OutcomeProcessed}; !slices.Equal(got, want) {
		t.Errorf("evt-1's handlings ended %v, want %v", got, want)
	}
	if got := o.attempts["evt-1"]; !slices.Equal(got, []int{1, 2}) {
		t.Errorf("evt-1's handlings began with attempts %v, want [1 2]", got)
	}
	// Dropped from the first batch when evt-1 failed, then handled in a
	// batch of its own once evt-1 was applied.
	if got, want := o.outcomes["evt-2"], []consumer.Outcome{consumer.OutcomeInterrupted, consumer.OutcomeProcessed}; !slices.Equal(got, want) {
		t.Errorf("evt-2's handlings ended %v, want %v", got, want)
	}
	if got := o.attempts["evt-2"]; !slices.Equal(got, []int{1, 1}) {
		t.Errorf("evt-2's handlings began with attempts %v, want [1 1]", got)
	}
}
