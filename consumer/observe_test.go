package consumer_test

import (
	"context"
	"errors"
	"fmt"
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
