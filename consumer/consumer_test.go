package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	tests := []struct {
		name  string
		edit  func(c *consumer.Config)
		field string // empty: valid
	}{
		{"defaults", func(c *consumer.Config) {}, ""},
		{"no name", func(c *consumer.Config) { c.Name = "" }, "Name"},
		{"no topic", func(c *consumer.Config) { c.Topic = "" }, "Topic"},
		{"no subscriber", func(c *consumer.Config) { c.Subscriber = nil }, "Subscriber"},
		{"no inbox", func(c *consumer.Config) { c.Inbox = nil }, "Inbox"},
		{"no dead letters", func(c *consumer.Config) { c.DeadLetters = nil }, "DeadLetters"},
		{"no ledger", func(c *consumer.Config) { c.Ledger = nil }, "Ledger"},
		{"negative concurrency", func(c *consumer.Config) { c.Concurrency = -1 }, "Concurrency"},
		{"pending below concurrency", func(c *consumer.Config) { c.Concurrency, c.MaxPending = 8, 4 }, "MaxPending"},
		// The bounds themselves are allowed: one delivery in memory per
		// worker, and a delivery bound equal to the attempts.
		{"pending equal to concurrency", func(c *consumer.Config) { c.Concurrency, c.MaxPending = 8, 8 }, ""},
		{"max deliveries equal to max attempts", func(c *consumer.Config) { c.MaxDeliveries = c.Retry.MaxAttempts }, ""},
		{"negative ack wait", func(c *consumer.Config) { c.AckWait = -time.Second }, "AckWait"},
		{"unknown order policy", func(c *consumer.Config) { c.AfterDeadLetter = 7 }, "AfterDeadLetter"},
		{"negative max attempts", func(c *consumer.Config) { c.Retry.MaxAttempts = -1 }, "MaxAttempts"},
		{"let through", func(c *consumer.Config) { c.AfterDeadLetter = consumer.LetThrough }, ""},
		{"sequence", func(c *consumer.Config) { c.Sequence = accountSequence }, ""},
		{"sequence, gaps allowed", func(c *consumer.Config) { c.Sequence, c.Gap = accountSequence, idem.GapAllow }, ""},
		{"sequence without a sequence inbox", func(c *consumer.Config) {
			c.Sequence, c.Inbox = accountSequence, processOnly{c.Inbox}
		}, "SequenceInbox"},
		{"unknown gap policy", func(c *consumer.Config) { c.Gap = 7 }, "Gap"},
		{"only required fields", func(c *consumer.Config) {
			*c = consumer.Config{Name: "n", Topic: "t", Subscriber: c.Subscriber, Inbox: c.Inbox, DeadLetters: c.DeadLetters, Ledger: c.Ledger}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := h.config()
			tt.edit(cfg)
			c, err := consumer.New(cfg)
			if tt.field == "" {
				if err != nil || c == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("New: %v, want an error matching idem.ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %s", err, tt.field)
			}
		})
	}
	if _, err := consumer.New(nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("New(nil): %v", err)
	}
}

// processOnly is an inbox that is not an idem.SequenceInbox.
type processOnly struct{ idem.Inbox }

func TestDuplicateAppliedOnceAndAcked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	c, _ := h.start(cfg, h.apply)
	// The same message three times (an outbox relay that crashed between
	// publish and mark), plus another.
	h.publish(msg("evt-1", ""), msg("evt-1", ""), msg("evt-2", ""), msg("evt-1", ""))
	waitFor(t, "four deliveries settled", func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates == 4
	})
	if got := h.applied.Get("evt-1"); got != 1 {
		t.Errorf("evt-1 applied %d times, want 1", got)
	}
	if got := h.applied.Get("evt-2"); got != 1 {
		t.Errorf("evt-2 applied %d times, want 1", got)
	}
	if s := c.Stats(); s.Processed != 2 || s.Duplicates != 2 {
		t.Errorf("stats %+v, want 2 processed and 2 duplicates", s)
	}
	waitFor(t, "every delivery of evt-1 acked", func() bool {
		return countOp(h.rec.Ops("evt-1"), "ack") == 3
	})
}

func TestTransientErrorRetriedUntilSuccess(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "acct-1"} {
		name := "keyed"
		if key == "" {
			name = "unkeyed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// fail-times=3: the first three attempts fail transiently; the
			// message settles once, on attempt 4.
			h := newHarness(t)
			var calls attemptsCounter
			c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
				if calls.add(ctx, m) <= 3 {
					return errFlaky
				}
				return h.apply(ctx, m)
			})
			h.publish(msg("evt-1", key))
			// Retried counts a retry once the transport is told, which may
			// come after its next delivery began: waited for too.
			h.advanceUntil("evt-1 retried 3 times and processed", time.Second, func() bool {
				s := c.Stats()
				return s.Processed == 1 && s.Retried >= 3
			})

			if got := h.applied.Get("evt-1"); got != 1 {
				t.Errorf("applied %d times, want 1", got)
			}
			if got, want := calls.Seen("evt-1"), []int{1, 2, 3, 4}; !slices.Equal(got, want) {
				t.Errorf("handler saw attempts %v, want %v", got, want)
			}
			if s := c.Stats(); s.Retried != 3 || s.DeadLettered != 0 {
				t.Errorf("stats %+v, want 3 retried and none dead-lettered", s)
			}
			waitFor(t, "evt-1 acked", func() bool { return countOp(h.rec.Ops("evt-1"), "ack") == 1 })
			ops := h.rec.Ops("evt-1")
			if key == "" {
				// Handed back to the transport with the policy's delay.
				if got := countOp(ops, "nack 1s"); got != 3 {
					t.Errorf("ops %v: want 3 Nacks of 1s", ops)
				}
			} else if got := countOp(ops, "deliver"); got != 1 {
				// Retried inside the consumer, holding the key's place.
				t.Errorf("ops %v: want one delivery", ops)
			}
			if a, _ := h.ledger.Attempts(context.Background(), "settlement", "evt-1"); len(a) != 0 {
				t.Errorf("ledger still holds %d attempts after success", len(a))
			}
			if n := len(h.letters()); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
		})
	}
}

func TestPermanentErrorDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls attemptsCounter
	c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
		calls.add(ctx, m)
		if m.ID == "bad" {
			return idem.Permanent(errors.New("unknown payment pay_404"))
		}
		return h.apply(ctx, m)
	})
	bad := msg("bad", "acct-1")
	bad.Headers = map[string]string{"Trace": "t-1"}
	h.publish(bad)
	waitFor(t, "dead letter", func() bool { return c.Stats().DeadLettered == 1 })

	dls := h.letters()
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if dl.Class != idem.DeadPermanent || dl.Consumer != "settlement" || dl.State != idem.LetterDead {
		t.Errorf("letter class %q consumer %q state %q", dl.Class, dl.Consumer, dl.State)
	}
	if dl.Message.ID != "bad" || dl.Message.Key != "acct-1" || dl.Message.Topic != topic ||
		string(dl.Message.Payload) != string(bad.Payload) || dl.Message.Headers["Trace"] != "t-1" {
		t.Errorf("letter message %+v is not the original", dl.Message)
	}
	if len(dl.Attempts) != 1 || dl.Attempts[0].Number != 1 || dl.Attempts[0].Class != idem.ClassPermanent ||
		dl.Attempts[0].Error != "unknown payment pay_404" || !dl.Attempts[0].At.Equal(h.clock.Now()) {
		t.Errorf("attempts %+v, want one permanent attempt", dl.Attempts)
	}
	if !dl.FirstFailedAt.Equal(h.clock.Now()) || !dl.LastFailedAt.Equal(h.clock.Now()) {
		t.Errorf("first/last failure %v/%v", dl.FirstFailedAt, dl.LastFailedAt)
	}
	waitFor(t, "bad terminated", func() bool { return slices.Contains(h.rec.Ops("bad"), "term") })
	if got := calls.Calls("bad"); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
	if s := c.Stats(); s.Retried != 0 {
		t.Errorf("stats %+v: a permanent error was retried", s)
	}
}

func TestExhaustedAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "acct-1"} {
		t.Run("key="+key, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			var calls attemptsCounter
			c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
				n := calls.add(ctx, m)
				return errors.New("timeout #" + string(rune('0'+n)))
			})
			start := h.clock.Now()
			h.publish(msg("evt-1", key))
			waitFor(t, "the first attempt recorded", func() bool {
				a, _ := h.ledger.Attempts(context.Background(), "settlement", "evt-1")
				return len(a) == 1
			})
			h.advanceUntil("dead letter", time.Second, func() bool { return c.Stats().DeadLettered == 1 })

			dls := h.letters()
			if len(dls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dls))
			}
			dl := dls[0]
			if dl.Class != idem.DeadExhausted {
				t.Errorf("class %q, want exhausted", dl.Class)
			}
			if len(dl.Attempts) != 5 {
				t.Fatalf("%d attempts recorded, want 5: %+v", len(dl.Attempts), dl.Attempts)
			}
			for i, a := range dl.Attempts {
				if a.Number != i+1 || a.Class != idem.ClassTransient || a.Error != "timeout #"+string(rune('1'+i)) {
					t.Errorf("attempt %d: %+v", i+1, a)
				}
				if i > 0 && !a.At.After(dl.Attempts[i-1].At) {
					t.Errorf("attempt %d at %v, not after the one before", i+1, a.At)
				}
			}
			if !dl.FirstFailedAt.Equal(start) || !dl.LastFailedAt.Equal(dl.Attempts[4].At) {
				t.Errorf("first/last failure %v/%v, attempts %+v", dl.FirstFailedAt, dl.LastFailedAt, dl.Attempts)
			}
			if dl.LastError() != "timeout #5" {
				t.Errorf("last error %q", dl.LastError())
			}
			if got := calls.Calls("evt-1"); got != 5 {
				t.Errorf("handler ran %d times, want 5", got)
			}
			if a, _ := h.ledger.Attempts(context.Background(), "settlement", "evt-1"); len(a) != 0 {
				t.Errorf("ledger still holds %d attempts after dead-lettering", len(a))
			}
			waitFor(t, "evt-1 terminated", func() bool { return slices.Contains(h.rec.Ops("evt-1"), "term") })
		})
	}
}

func TestAttemptCountSurvivesRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var first, second attemptsCounter
	third := make(chan struct{})
	cfg := h.config()
	_, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if first.add(ctx, m) == 3 {
			// The process goes down during the third attempt.
			close(third)
			<-ctx.Done()
			return ctx.Err()
		}
		return errFlaky
	})
	h.publish(msg("evt-1", "acct-1"))
	h.advanceUntil("the third attempt", time.Second, func() bool {
		select {
		case <-third:
			return true
		default:
			return false
		}
	})
	stop()
	if a, _ := h.ledger.Attempts(context.Background(), "settlement", "evt-1"); len(a) != 2 {
		t.Fatalf("ledger holds %d attempts after the first run, want 2", len(a))
	}

	// A new consumer on the same ledger and transport starts again at
	// attempt 3 (the interrupted one did not count), and gives up after the
	// fifth.
	c2, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		second.add(ctx, m)
		return errFlaky
	})
	h.advanceUntil("dead letter", time.Second, func() bool { return c2.Stats().DeadLettered == 1 })
	if got := second.Seen("evt-1"); !slices.Equal(got, []int{3, 4, 5}) {
		t.Errorf("second run saw attempts %v, want [3 4 5]", got)
	}
	dl := h.letters()[0]
	if len(dl.Attempts) != 5 {
		t.Errorf("dead letter has %d attempts, want 5", len(dl.Attempts))
	}
	for i, a := range dl.Attempts {
		if a.Number != i+1 {
			t.Errorf("attempt %d numbered %d", i+1, a.Number)
		}
	}
}

func TestRetryAfterDelayHonoured(t *testing.T) {
	t.Parallel()
	const wait = 42 * time.Second
	h := newHarness(t)
	var calls attemptsCounter
	c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 {
			return idem.RetryAfter(errors.New("429 rate limited"), wait)
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("keyed", "acct-1"), msg("free", ""))

	waitFor(t, "the keyed message's retry timer", func() bool { return h.timers.Pending(wait) == 1 })
	waitFor(t, "the unkeyed message nacked", func() bool {
		return slices.Contains(h.rec.Ops("free"), "nack "+wait.String())
	})
	h.timers.Advance(wait - time.Second)
	if got := calls.Calls("keyed"); got != 1 {
		t.Fatalf("keyed ran %d times before its delay ended", got)
	}
	h.timers.Advance(time.Second)
	waitFor(t, "both processed", func() bool { return c.Stats().Processed == 2 })
	if got := calls.Calls("keyed") + calls.Calls("free"); got != 4 {
		t.Errorf("%d calls in all, want 4", got)
	}
}

func TestWaitingKeyDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var mu sync.Mutex
	var order []string
	handled := make(chan string, 10)
	var calls attemptsCounter
	cfg := h.config()
	cfg.Concurrency = 1 // one worker: the waiting message must not hold it
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 && m.ID == "a1" {
			return idem.RetryAfter(errFlaky, time.Hour)
		}
		mu.Lock()
		order = append(order, m.ID)
		mu.Unlock()
		handled <- m.ID
		return nil
	})
	h.publish(msg("a1", "A"), msg("a2", "A"), msg("b1", "B"), msg("b2", "B"))

	// b1 and b2 go through while a1 waits an hour (the clock stands still).
	for _, want := range []string{"b1", "b2"} {
		select {
		case got := <-handled:
			if got != want {
				t.Fatalf("handled %s, want %s", got, want)
			}
		case <-time.After(waitLimit):
			t.Fatalf("%s not handled while key A waits for its retry", want)
		}
	}
	// a2 is held behind a1, so it cannot have run.
	if n := calls.Calls("a2"); n != 0 {
		t.Fatalf("a2 ran %d times while a1 waited for its retry", n)
	}
	if h.timers.Pending(time.Hour) != 1 {
		t.Fatalf("a1's retry timer is not pending")
	}
	h.timers.Advance(time.Hour)
	waitFor(t, "all processed", func() bool { return c.Stats().Processed == 4 })
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"b1", "b2", "a1", "a2"}; !slices.Equal(order, want) {
		t.Errorf("applied %v, want %v", order, want)
	}
}

func TestParkAfterDeadLetter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls attemptsCounter
	poisoned := true
	var mu sync.Mutex
	c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
		calls.add(ctx, m)
		mu.Lock()
		p := poisoned
		mu.Unlock()
		if m.ID == "k1" && p {
			return idem.Permanent(errors.New("malformed"))
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("k1", "K"), msg("k2", "K"), msg("o1", "O"), msg("k3", "K"))
	waitFor(t, "k2 and k3 parked, o1 processed", func() bool {
		s := c.Stats()
		return s.Parked == 2 && s.Processed == 1 && s.DeadLettered == 1
	})
	if calls.Calls("k2") != 0 || calls.Calls("k3") != 0 {
		t.Errorf("parked messages reached the handler")
	}
	dls := h.letters()
	letter, held, err := h.ledger.HeldBack(context.Background(), "settlement", "K")
	if err != nil || !held || len(dls) != 1 || letter != dls[0].ID {
		t.Fatalf("HeldBack = %q, %v, %v; want the dead letter %v", letter, held, err, dls)
	}
	if _, held, _ := h.ledger.HeldBack(context.Background(), "settlement", "O"); held {
		t.Errorf("key O is held back")
	}
	waitFor(t, "k2 and k3 acked", func() bool {
		return slices.Contains(h.rec.Ops("k2"), "ack") && slices.Contains(h.rec.Ops("k3"), "ack")
	})

	// What re-driving does: fix the cause, let the key go, and publish the
	// letter and then the parked messages again, in order.
	mu.Lock()
	poisoned = false
	mu.Unlock()
	parked, err := h.ledger.LetGo(context.Background(), "settlement", "K")
	if err != nil {
		t.Fatal(err)
	}
	if ids := messageIDs(parked); !slices.Equal(ids, []string{"k2", "k3"}) {
		t.Fatalf("parked %v, want [k2 k3]", ids)
	}
	h.publish(append([]idem.Message{dls[0].Message}, parked...)...)
	waitFor(t, "the key's messages processed", func() bool { return c.Stats().Processed == 4 })
	for _, id := range []string{"k1", "k2", "k3", "o1"} {
		if got := h.applied.Get(id); got != 1 {
			t.Errorf("%s applied %d times, want 1", id, got)
		}
	}
}

func TestLetThroughAfterDeadLetter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AfterDeadLetter = consumer.LetThrough
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "k1" {
			return idem.Permanent(errors.New("malformed"))
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("k1", "K"), msg("k2", "K"), msg("k3", "K"))
	// k1's dead letter is counted once the transport is told, after k2
	// may have begun: waited for too.
	waitFor(t, "k1 dead-lettered, k2 and k3 processed", func() bool {
		s := c.Stats()
		return s.Processed == 2 && s.DeadLettered >= 1
	})
	if s := c.Stats(); s.Parked != 0 || s.DeadLettered != 1 {
		t.Errorf("stats %+v", s)
	}
	if _, held, _ := h.ledger.HeldBack(context.Background(), "settlement", "K"); held {
		t.Errorf("key K held back under LetThrough")
	}
}

func TestHandlerPanicIsTransient(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls attemptsCounter
	c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
		n := calls.add(ctx, m)
		if m.ID == "always" || n == 1 {
			// The effect made before the panic must be rolled back.
			_ = h.apply(ctx, m)
			panic("nil map")
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("once", "K"), msg("always", "L"))
	h.advanceUntil("once processed, always dead-lettered", time.Second, func() bool {
		s := c.Stats()
		return s.Processed == 1 && s.DeadLettered == 1
	})
	if got := h.applied.Get("once"); got != 1 {
		t.Errorf("once applied %d times, want 1", got)
	}
	if got := h.applied.Get("always"); got != 0 {
		t.Errorf("a panicking handler's effect was committed %d times", got)
	}
	dl := h.letters()[0]
	if dl.Class != idem.DeadExhausted || len(dl.Attempts) != 5 {
		t.Fatalf("letter %q with %d attempts, want exhausted with 5", dl.Class, len(dl.Attempts))
	}
	for _, a := range dl.Attempts {
		if a.Class != idem.ClassTransient || !strings.Contains(a.Error, "panicked: nil map") {
			t.Errorf("attempt %+v", a)
		}
	}
}

func TestDedupKeyFromPayload(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.DedupKey = func(m idem.Message) (string, error) {
		var body struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(m.Payload, &body); err != nil {
			return "", err
		}
		return body.EventID, nil
	}
	var infos []consumer.Info
	var mu sync.Mutex
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		info, ok := consumer.InfoFromContext(ctx)
		if !ok {
			t.Error("no Info in the handler's context")
		}
		mu.Lock()
		infos = append(infos, info)
		mu.Unlock()
		return h.applied.Add(ctx, "total", 1)
	})
	h.publish(
		idem.Message{ID: "t-1", Key: "acct", Payload: []byte(`{"event_id":"e-1"}`)},
		// The same event re-published under another transport ID.
		idem.Message{ID: "t-2", Key: "acct", Payload: []byte(`{"event_id":"e-1"}`)},
		idem.Message{ID: "t-3", Key: "acct", Payload: []byte(`{not json`)},
		idem.Message{ID: "t-4", Key: "other", Payload: []byte(`{"event_id":""}`)},
	)
	waitFor(t, "all settled", func() bool {
		s := c.Stats()
		return s.Processed == 1 && s.Duplicates == 1 && s.DeadLettered == 2
	})
	if got := h.applied.Get("total"); got != 1 {
		t.Errorf("applied %d times, want 1", got)
	}
	mu.Lock()
	if len(infos) != 1 || infos[0] != (consumer.Info{Consumer: "settlement", DedupKey: "e-1", Attempt: 1}) {
		t.Errorf("infos %+v", infos)
	}
	mu.Unlock()
	for _, dl := range h.letters() {
		if dl.Class != idem.DeadPermanent || !strings.HasPrefix(dl.LastError(), "dedup key:") {
			t.Errorf("letter %s: class %q, error %q", dl.Message.ID, dl.Class, dl.LastError())
		}
	}
}

// failingInbox fails its first Process calls without running fn, as a
// database that is down does.
type failingInbox struct {
	idem.Inbox
	mu    sync.Mutex
	fails int
}

func (f *failingInbox) Process(ctx context.Context, consumer, key string, fn func(context.Context) error) error {
	f.mu.Lock()
	fail := f.fails > 0
	f.fails--
	f.mu.Unlock()
	if fail {
		// Even an error that looks permanent is the store's, not the
		// message's: it must not dead-letter the message.
		return idem.Permanent(errors.New("connection refused"))
	}
	return f.Inbox.Process(ctx, consumer, key, fn)
}

func TestInboxFailureIsTransient(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Inbox = &failingInbox{Inbox: h.inbox, fails: 2}
	c, _ := h.start(cfg, h.apply)
	h.publish(msg("evt-1", "K"))
	h.advanceUntil("retried twice and processed", time.Second, func() bool {
		s := c.Stats()
		return s.Processed == 1 && s.Retried >= 2
	})
	if s := c.Stats(); s.Retried != 2 || s.DeadLettered != 0 {
		t.Errorf("stats %+v, want 2 retried, none dead-lettered", s)
	}
}

func TestRunStopsCleanlyOnCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	started := make(chan struct{})
	var once sync.Once
	cfg := h.config()
	c, stop := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		once.Do(func() { close(started) })
		<-ctx.Done() // a handler in flight at shutdown
		return ctx.Err()
	})
	h.publish(msg("evt-1", "K"), msg("evt-2", "K"))
	select {
	case <-started:
	case <-time.After(waitLimit):
		t.Fatal("handler did not start")
	}
	stop() // fails the test unless Run returns nil
	if s := c.Stats(); s != (consumer.Stats{}) {
		t.Errorf("stats %+v after an interrupted run, want zero", s)
	}
	if ops := h.rec.Ops("evt-1"); slices.ContainsFunc(ops, func(op string) bool { return op != "deliver" && op != "in-progress" }) {
		t.Errorf("evt-1 settled at shutdown: %v", ops)
	}
	if a, _ := h.ledger.Attempts(context.Background(), "settlement", "evt-1"); len(a) != 0 {
		t.Errorf("the interrupted attempt was recorded: %+v", a)
	}

	// Unsettled deliveries come back to the next run, in order.
	var mu sync.Mutex
	var got []string
	c2, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		mu.Lock()
		got = append(got, m.ID)
		mu.Unlock()
		return nil
	})
	waitFor(t, "both processed by the next run", func() bool { return c2.Stats().Processed == 2 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"evt-1", "evt-2"}) {
		t.Errorf("next run applied %v", got)
	}
}

func TestRunTwiceAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	c, _ := h.start(h.config(), h.apply)
	h.publish(msg("evt-1", ""))
	waitFor(t, "running", func() bool { return c.Stats().Processed == 1 })
	if err := c.Run(context.Background(), h.apply); !errors.Is(err, consumer.ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
	if err := c.Run(context.Background(), nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Run(nil): %v", err)
	}
}

// A consumer holds no more deliveries than MaxPending, and keeps those it
// holds, running or queued, its own past AckWait (the heartbeat renews
// each once a beat), so that the transport does not deliver them again.
// The clock moves only once all three are in memory (a handler begins
// only there), so that how fast the reader puts them there does not
// matter: counted from when the transport handed them out, their
// renewals are due at every beat from then on.
func TestBackpressureAndHeartbeats(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	const ackWait, beat = 40 * time.Second, 10 * time.Second
	cfg.Concurrency, cfg.MaxPending, cfg.AckWait = 2, 3, ackWait
	release := make(chan struct{})
	m0, m2 := make(chan struct{}), make(chan struct{})
	var m0Once, m2Once sync.Once
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "m0" || m.ID == "m2" {
			if m.ID == "m0" {
				m0Once.Do(func() { close(m0) })
			} else {
				m2Once.Do(func() { close(m2) })
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return h.apply(ctx, m)
	})
	waitFor(t, "the heartbeat waiting for its first beat", func() bool { return h.timers.Pending(beat) == 1 })
	// m0 first, alone, so that m2, of another key, is not taken into its
	// batch but runs beside it.
	h.publish(msg("m0", "K"))
	waitClosed(t, "m0's handler", m0)
	h.publish(msg("m1", "K"), msg("m2", "L"))
	for i := 3; i < 10; i++ {
		h.publish(msg("m"+string(rune('0'+i)), "K"))
	}
	// m1, taken before m2, is in memory too, queued behind m0.
	waitClosed(t, "m2's handler", m2)
	// The consumer holds three deliveries: it must take no more, and keep
	// those it holds alive past AckWait.
	held := []string{"m0", "m1", "m2"}
	for i := 1; i <= 5; i++ {
		h.timers.Advance(beat)
		// The heartbeat renews what is due before it waits again.
		waitFor(t, "the heartbeat waiting again", func() bool { return h.timers.Pending(beat) == 1 })
		for _, id := range held {
			if n := countOp(h.rec.Ops(id), "in-progress"); n != i {
				t.Fatalf("after %d beats of %s, %s renewed %d times; want once a beat", i, beat, id, n)
			}
		}
	}
	if got := h.rec.Taken(); got != 3 {
		t.Errorf("%d deliveries taken with MaxPending 3", got)
	}
	close(release)
	waitFor(t, "all processed", func() bool { return c.Stats().Processed == 10 })
	if s, taken := c.Stats(), h.rec.Taken(); s.Duplicates != 0 || taken != 10 {
		t.Errorf("stats %+v, %d deliveries: held deliveries were delivered again", s, taken)
	}
}

func countOp(ops []string, op string) int {
	n := 0
	for _, o := range ops {
		if o == op {
			n++
		}
	}
	return n
}

func messageIDs(msgs []idem.Message) []string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.ID)
	}
	return ids
}

// Compile-time checks that the in-memory stores fit.
var (
	_ idem.Timers = (*fakeTimers)(nil)
	_ idem.Inbox  = (*idemmem.Inbox)(nil)
)

func TestHandlerErrorWrappingErrDuplicateIsAFailure(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var calls attemptsCounter
	c, _ := h.start(h.config(), func(ctx context.Context, m idem.Message) error {
		if calls.add(ctx, m) == 1 {
			// A handler's own call that failed with ErrDuplicate is still
			// the handler's failure, not a duplicate message.
			return fmt.Errorf("downstream: %w", idem.ErrDuplicate)
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("evt-1", "K"))
	h.advanceUntil("retried and processed", time.Second, func() bool {
		s := c.Stats()
		return s.Processed == 1 && s.Retried >= 1
	})
	if s := c.Stats(); s.Duplicates != 0 || s.Retried != 1 {
		t.Errorf("stats %+v, want 1 retried and no duplicate", s)
	}
}

// Deliveries held past their AckWait (a heartbeat late) are given out
// again while the consumer holds them: each message is applied once, in
// order. m1's handler holds until the late beat has found m1, m2 and m3
// stale (m2 and m3 published once m1's handling began, so that no batch
// takes them behind it): m2's and m3's first deliveries are let go for
// their redeliveries (Stale), and m1's redelivery is a duplicate.
func TestLateHeartbeatRedeliveryIsAbsorbed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Concurrency, cfg.AckWait = 1, 40*time.Second
	const beat = 10 * time.Second
	g := newGate()
	var mu sync.Mutex
	var order []string
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "m1" {
			g.hold()
		}
		if err := h.apply(ctx, m); err != nil {
			return err
		}
		mu.Lock()
		order = append(order, m.ID)
		mu.Unlock()
		return nil
	})
	release := sync.OnceFunc(g.release)
	t.Cleanup(release)
	waitFor(t, "the heartbeat waiting", func() bool { return h.timers.Pending(beat) == 1 })
	h.publish(msg("m1", "K"))
	g.wait(t, "m1's handler")
	asked, more := h.rec.holdNext(3)
	t.Cleanup(func() { more() })
	h.publish(msg("m2", "K"), msg("m3", "K"))
	waitAsked(t, "m2 and m3 in memory", asked)
	h.timers.Advance(2 * time.Minute)
	more()
	waitFor(t, "the redeliveries taken", func() bool { return h.rec.Taken() == 6 })
	waitFor(t, "the late beat done", func() bool { return h.timers.Pending(beat) == 1 })
	release()
	waitFor(t, "all settled or let go", func() bool {
		s := c.Stats()
		return s.Processed+s.Duplicates+s.Stale == 6
	})
	if s := c.Stats(); s.Processed != 3 || s.Duplicates != 1 || s.Stale != 2 {
		t.Errorf("stats %+v, want 3 processed, 1 duplicate (m1's copy), 2 stale (m2's and m3's first deliveries)", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[m1 m2 m3]" {
		t.Errorf("applied %v", order)
	}
}

// Stats counts a message once its delivery is settled: whoever reads the
// count and then looks at the transport finds the acknowledgement sent.
// Held at the transport, an acknowledgement holds the count back, for a
// message processed and for a duplicate, acknowledged in the inbox's
// transaction or after it.
func TestStatsCountOnceAcknowledged(t *testing.T) {
	t.Parallel()
	for _, afterTx := range []bool{false, true} {
		name := "acks in the inbox's transaction"
		if afterTx {
			name = "acks after the inbox's transaction"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.rec.acksAfterTx = afterTx
			c, _ := h.start(h.config(), h.apply)

			release := h.rec.holdAcks()
			h.publish(msg("evt-1", "K"))
			waitFor(t, "evt-1's acknowledgement sent", func() bool { return countOp(h.rec.Ops("evt-1"), "ack") == 1 })
			if s := c.Stats(); s != (consumer.Stats{}) {
				t.Errorf("stats %+v while evt-1's acknowledgement is held; want nothing counted", s)
			}
			release()
			waitFor(t, "evt-1 counted as processed", func() bool { return c.Stats().Processed == 1 })

			release = h.rec.holdAcks()
			h.publish(msg("evt-1", "K"))
			waitFor(t, "the copy's acknowledgement sent", func() bool { return countOp(h.rec.Ops("evt-1"), "ack") == 2 })
			if s := c.Stats(); s != (consumer.Stats{Processed: 1}) {
				t.Errorf("stats %+v while the copy's acknowledgement is held; want 1 processed, no duplicate", s)
			}
			release()
			waitFor(t, "the copy counted as a duplicate", func() bool { return c.Stats().Duplicates == 1 })
			if got := h.applied.Get("evt-1"); got != 1 {
				t.Errorf("evt-1 applied %d times, want 1", got)
			}
		})
	}
}

// subscriptions is a Subscriber that writes down every Subscription asked
// of it.
type subscriptions struct {
	idem.Subscriber
	mu   sync.Mutex
	subs []idem.Subscription
}

func (s *subscriptions) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	return s.Subscriber.Subscribe(ctx, sub)
}

// MaxPending left zero defaults to Concurrency times the larger of 64 and
// twice BatchSize, as its documentation says, and it is the subscription's
// MaxInFlight: the transport hands out no more than the consumer holds.
func TestMaxPendingDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		concurrency, batch, maxPending int
		want                           int
	}{
		{3, 100, 0, 600},
		{2, 10, 0, 128},
		{0, 0, 0, 800}, // Concurrency 4 and BatchSize 100 by default
		{2, 10, 5, 5},
	} {
		h := newHarness(t)
		subs := &subscriptions{Subscriber: h.rec}
		cfg := h.config()
		cfg.Subscriber = subs
		cfg.Concurrency, cfg.BatchSize, cfg.MaxPending = tc.concurrency, tc.batch, tc.maxPending
		c, stop := h.start(cfg, h.apply)
		<-c.Subscribed()
		stop()
		subs.mu.Lock()
		got := slices.Clone(subs.subs)
		subs.mu.Unlock()
		if len(got) != 1 || got[0].MaxInFlight != tc.want || got[0].AckWait != 30*time.Second {
			t.Errorf("Concurrency %d, BatchSize %d, MaxPending %d: subscribed with %+v, want MaxInFlight %d (and AckWait 30s)",
				tc.concurrency, tc.batch, tc.maxPending, got, tc.want)
		}
	}
}
