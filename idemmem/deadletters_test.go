package idemmem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func deadLetter(id string) idem.DeadLetter {
	at := start
	return idem.DeadLetter{
		Consumer:      "settlement",
		Message:       idem.Message{ID: id, Topic: "payments.succeeded", Payload: []byte("{")},
		Class:         idem.DeadPermanent,
		Attempts:      []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: "malformed JSON"}},
		FirstFailedAt: at,
		LastFailedAt:  at,
	}
}

func TestDeadLettersJoinTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := idemmem.NewDeadLetters(nil)
	l := idemmem.NewLedger()
	var rolledBack string
	_ = idemmem.Transact(ctx, func(ctx context.Context) error {
		rolledBack, _ = d.Add(ctx, deadLetter("m1"))
		return errors.New("later step failed")
	})
	if _, err := d.Get(ctx, rolledBack); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(letter of a rolled back Tx) = %v, want ErrNotFound", err)
	}

	// The consumer's dead-lettering: the letter, the hold on its key and
	// the end of its attempts commit together.
	var id string
	err := idemmem.Transact(ctx, func(ctx context.Context) error {
		var err error
		if id, err = d.Add(ctx, deadLetter("m2")); err != nil {
			return err
		}
		if err := l.HoldBack(ctx, "settlement", "acct-1", id); err != nil {
			return err
		}
		return l.ForgetAttempts(ctx, "settlement", "m2")
	})
	if err != nil {
		t.Fatal(err)
	}
	if id == rolledBack {
		t.Errorf("a rolled back letter's ID %q was reused", id)
	}
	if dl, err := d.Get(ctx, id); err != nil || dl.State != idem.LetterDead {
		t.Errorf("Get(%q) = %+v, %v", id, dl, err)
	}
	if letter, held, _ := l.HeldBack(ctx, "settlement", "acct-1"); !held || letter != id {
		t.Errorf("HeldBack = %q, %v; want %q, true", letter, held, id)
	}
}

func TestResolveStampsTime(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(start)
	d := idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock})
	id, err := d.Add(t.Context(), deadLetter("m1"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	dl, err := d.Resolve(t.Context(), id, idem.LetterDiscarded, idem.LetterEvent{Actor: "ops", Action: "discarded", Reason: "test data"})
	if err != nil {
		t.Fatal(err)
	}
	if ev := dl.History[len(dl.History)-1]; !ev.At.Equal(clock.Now()) || ev.State != idem.LetterDiscarded {
		t.Errorf("event = %+v, want at %v in state discarded", ev, clock.Now())
	}
	if _, err := d.List(t.Context(), idem.DeadLetterFilter{Limit: -1}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("List(negative limit) = %v, want ErrInvalidArgument", err)
	}
}
