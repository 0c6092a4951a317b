package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// failingLetters is a dead-letter store whose first Add fails, as one that
// is briefly unreachable does.
type failingLetters struct {
	*idemmem.DeadLetters
	failed atomic.Bool
}

func (f *failingLetters) Add(ctx context.Context, dl idem.DeadLetter) (string, error) {
	if f.failed.CompareAndSwap(false, true) {
		return "", errors.New("dead letters unavailable")
	}
	return f.DeadLetters.Add(ctx, dl)
}

// Nothing is lost when dead-lettering fails: the message stays in the
// flow, is retried after its delay, and its next attempt tries the dead
// letters again; it is neither dropped nor left in memory unsettled.
func TestFailedDeadLetterRetriesTheMessage(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "acct-1"} {
		name := "keyed"
		if key == "" {
			name = "unkeyed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			cfg := h.config()
			cfg.DeadLetters = &failingLetters{DeadLetters: h.dls}
			var calls attemptsCounter
			c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
				calls.add(ctx, m)
				return idem.Permanent(errors.New("card number malformed"))
			})
			h.publish(msg("evt-1", key))
			// The retry is counted once it is scheduled, which may come
			// after the attempt it scheduled has begun: waited for too.
			h.advanceUntil("evt-1 retried and dead-lettered", time.Second, func() bool {
				s := c.Stats()
				return s.DeadLettered == 1 && s.Retried >= 1
			})
			if s := c.Stats(); s.Retried != 1 {
				t.Errorf("Stats = %+v, want the message retried once, after the failed dead letter", s)
			}
			if n := calls.Calls("evt-1"); n != 2 {
				t.Errorf("the handler ran %d times, want 2 (the dead letter failed after the first)", n)
			}
			if dls := h.letters(); len(dls) != 1 || dls[0].Message.ID != "evt-1" {
				t.Errorf("dead letters %v, want evt-1's", dls)
			}
			waitFor(t, "evt-1's delivery terminated", func() bool { return countOp(h.rec.Ops("evt-1"), "term") == 1 })
		})
	}
}

// A message whose dedup key cannot be derived is dead-lettered at once;
// when that dead letter fails, its retry in memory (it has a key, so the
// transport's count stays 1) is its second attempt, and the dead letter
// says so.
func TestFailedDeadLetterOfAMalformedMessageCountsItsAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.DeadLetters = &failingLetters{DeadLetters: h.dls}
	cfg.DedupKey = func(idem.Message) (string, error) { return "", errors.New("no payment id") }
	c, _ := h.start(cfg, func(context.Context, idem.Message) error {
		t.Error("the handler ran for a message that cannot be de-duplicated")
		return nil
	})
	h.publish(msg("evt-1", "acct-1"))
	h.advanceUntil("evt-1 dead-lettered", time.Second, func() bool { return c.Stats().DeadLettered == 1 })
	dls := h.letters()
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	if as := dls[0].Attempts; len(as) != 1 || as[0].Number != 2 {
		t.Errorf("the dead letter's attempts: %+v; want one, number 2 (the first ended in the failed dead letter)", as)
	}
}
