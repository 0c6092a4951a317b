package idemtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

func outboxCase(wantFail string, broken func(o *idemmem.Outbox) idem.Outbox) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		idemtest.TestOutbox(t, func(t *testing.T, clock idem.Clock) idem.Outbox {
			return broken(idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock}))
		})
	}}
}

type markSentNoop struct{ *idemmem.Outbox }

func (markSentNoop) MarkSent(context.Context, ...int64) error { return nil }

type shortLease struct{ *idemmem.Outbox }

func (o shortLease) Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	return o.Outbox.Claim(ctx, relay, limit, lease/2)
}

type claimIgnoresLimit struct{ *idemmem.Outbox }

func (o claimIgnoresLimit) Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	return o.Outbox.Claim(ctx, relay, max(limit, 1)*100, lease)
}

var brokenOutboxes = map[string]brokenCase{
	"outbox: none":                    outboxCase("", func(o *idemmem.Outbox) idem.Outbox { return o }),
	"outbox: MarkSent does nothing":   outboxCase("MarkSent", func(o *idemmem.Outbox) idem.Outbox { return markSentNoop{o} }),
	"outbox: leases end early":        outboxCase("LiveLease", func(o *idemmem.Outbox) idem.Outbox { return shortLease{o} }),
	"outbox: Claim ignores its limit": outboxCase("Limit", func(o *idemmem.Outbox) idem.Outbox { return claimIgnoresLimit{o} }),
}
