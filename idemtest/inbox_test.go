package idemtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// counterEffects are InboxEffects on idemmem.Counters, which join the Tx
// that idemmem.Inbox gives fn.
type counterEffects struct{ c *idemmem.Counters }

func (e counterEffects) Write(ctx context.Context, tag string) error {
	if _, ok := idemmem.TxFromContext(ctx); !ok {
		return errors.New("no idemmem.Tx in the context")
	}
	return e.c.Add(ctx, tag, 1)
}

func (e counterEffects) Count(_ context.Context, tag string) (int, error) {
	return int(e.c.Get(tag)), nil
}

type inboxFunc func(ctx context.Context, consumer, key string, fn func(context.Context) error) error

func (f inboxFunc) Process(ctx context.Context, consumer, key string, fn func(context.Context) error) error {
	return f(ctx, consumer, key, fn)
}

// inboxCase runs TestInbox on an inbox that broken builds over a
// reference one.
func inboxCase(wantFail string, broken func(in *idemmem.Inbox) idem.Inbox) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
			return broken(idemmem.NewInbox()), counterEffects{&idemmem.Counters{}}
		})
	}}
}

var brokenInboxes = map[string]brokenCase{
	"inbox: none": inboxCase("", func(in *idemmem.Inbox) idem.Inbox { return in }),
	// Watermill's de-duplicator: the message is marked seen before the
	// handler runs, and stays marked when it fails.
	"inbox: records before fn runs": inboxCase("FailureLeavesNothing", func(in *idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, c, k string, fn func(context.Context) error) error {
			if err := in.Process(ctx, c, k, func(context.Context) error { return nil }); err != nil {
				return err
			}
			return idemmem.Transact(ctx, fn)
		})
	}),
	"inbox: commits a failed fn": inboxCase("FailureLeavesNothing", func(in *idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, c, k string, fn func(context.Context) error) error {
			var fnErr error
			if err := in.Process(ctx, c, k, func(ctx context.Context) error { fnErr = fn(ctx); return nil }); err != nil {
				return err
			}
			return fnErr
		})
	}),
	"inbox: never a duplicate": inboxCase("FirstRunsThenDuplicate", func(*idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, _, _ string, fn func(context.Context) error) error {
			return idemmem.Transact(ctx, fn)
		})
	}),
	"inbox: one namespace for every consumer": inboxCase("Namespaces", func(in *idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, _, k string, fn func(context.Context) error) error {
			return in.Process(ctx, "everyone", k, fn)
		})
	}),
}
