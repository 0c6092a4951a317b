package idemtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

func deadLettersCase(wantFail string, broken func(d *idemmem.DeadLetters) idem.DeadLetters) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		idemtest.TestDeadLetters(t, func(t *testing.T, clock idem.Clock) idem.DeadLetters {
			return broken(idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock}))
		})
	}}
}

type getDropsHeaders struct{ *idemmem.DeadLetters }

func (d getDropsHeaders) Get(ctx context.Context, id string) (idem.DeadLetter, error) {
	dl, err := d.DeadLetters.Get(ctx, id)
	dl.Message.Headers = nil
	return dl, err
}

type listIgnoresSince struct{ *idemmem.DeadLetters }

func (d listIgnoresSince) List(ctx context.Context, f idem.DeadLetterFilter) ([]idem.DeadLetter, error) {
	f.Since = time.Time{}
	return d.DeadLetters.List(ctx, f)
}

type resolvesResolved struct{ *idemmem.DeadLetters }

// Resolve pretends a letter that is no longer dead moved again.
func (d resolvesResolved) Resolve(ctx context.Context, id string, to idem.LetterState, ev idem.LetterEvent) (idem.DeadLetter, error) {
	if dl, err := d.Get(ctx, id); err == nil && dl.State != idem.LetterDead {
		return dl, nil
	}
	return d.DeadLetters.Resolve(ctx, id, to, ev)
}

type statsIgnoresOldest struct{ *idemmem.DeadLetters }

func (d statsIgnoresOldest) Stats(ctx context.Context) ([]idem.DeadLetterStats, error) {
	st, err := d.DeadLetters.Stats(ctx)
	for i := range st {
		st[i].Oldest = time.Time{}
	}
	return st, err
}

var brokenDeadLetters = map[string]brokenCase{
	"dead letters: none":                 deadLettersCase("", func(d *idemmem.DeadLetters) idem.DeadLetters { return d }),
	"dead letters: Get drops headers":    deadLettersCase("AddGet", func(d *idemmem.DeadLetters) idem.DeadLetters { return getDropsHeaders{d} }),
	"dead letters: List ignores Since":   deadLettersCase("List", func(d *idemmem.DeadLetters) idem.DeadLetters { return listIgnoresSince{d} }),
	"dead letters: resolves twice":       deadLettersCase("ResolveRefused", func(d *idemmem.DeadLetters) idem.DeadLetters { return resolvesResolved{d} }),
	"dead letters: Stats without oldest": deadLettersCase("Stats", func(d *idemmem.DeadLetters) idem.DeadLetters { return statsIgnoresOldest{d} }),
}
