package idemtest_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

func ledgerCase(wantFail string, broken func(l *idemmem.Ledger) idem.Ledger) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		idemtest.TestLedger(t, func(t *testing.T) idem.Ledger { return broken(idemmem.NewLedger()) })
	}}
}

type forgetNoop struct{ *idemmem.Ledger }

func (forgetNoop) ForgetAttempts(context.Context, string, string) error { return nil }

type attemptsIgnoreConsumer struct{ *idemmem.Ledger }

func (l attemptsIgnoreConsumer) RecordAttempt(ctx context.Context, _, key string, a idem.Attempt) ([]idem.Attempt, error) {
	return l.Ledger.RecordAttempt(ctx, "everyone", key, a)
}

func (l attemptsIgnoreConsumer) Attempts(ctx context.Context, _, key string) ([]idem.Attempt, error) {
	return l.Ledger.Attempts(ctx, "everyone", key)
}

type letGoKeepsHold struct{ *idemmem.Ledger }

func (l letGoKeepsHold) LetGo(ctx context.Context, consumer, key string) ([]idem.Message, error) {
	letter, held, err := l.HeldBack(ctx, consumer, key)
	if err != nil {
		return nil, err
	}
	msgs, err := l.Ledger.LetGo(ctx, consumer, key)
	if err == nil && held {
		err = l.HoldBack(ctx, consumer, key, letter)
	}
	return msgs, err
}

type parksTwice struct{ *idemmem.Ledger }

// Park parks a redelivered message again, under a new ID.
func (l parksTwice) Park(ctx context.Context, consumer string, m idem.Message) error {
	if err := l.Ledger.Park(ctx, consumer, m); err != nil {
		return err
	}
	m.ID += "-again"
	return l.Ledger.Park(ctx, consumer, m)
}

var brokenLedgers = map[string]brokenCase{
	"ledger: none":                        ledgerCase("", func(l *idemmem.Ledger) idem.Ledger { return l }),
	"ledger: ForgetAttempts does nothing": ledgerCase("ForgetAttempts", func(l *idemmem.Ledger) idem.Ledger { return forgetNoop{l} }),
	"ledger: attempts of every consumer":  ledgerCase("IndependentKeys", func(l *idemmem.Ledger) idem.Ledger { return attemptsIgnoreConsumer{l} }),
	"ledger: LetGo keeps the hold":        ledgerCase("HoldParkLetGo", func(l *idemmem.Ledger) idem.Ledger { return letGoKeepsHold{l} }),
	"ledger: parks a message twice":       ledgerCase("ParkTwice", func(l *idemmem.Ledger) idem.Ledger { return parksTwice{l} }),
}
