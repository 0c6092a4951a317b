package consumer

import (
	"context"

	"github.com/idem-go/idem"
)

// NoInbox is an idem.Inbox that de-duplicates nothing: Process runs fn
// every time, with ctx as it is (no transaction is begun), and records
// nothing, so every delivery of a message reaches the handler, redeliveries
// included.
//
// It is for handlers whose effect is idempotent by itself, where an inbox
// row would cost a write and add nothing: one that sets a state guarded by
// a version it checks itself, or one that passes the message's ID on as
// the idempotency key of a service that de-duplicates by it. An effect
// that adds (a total, a balance, a count) counts a redelivered message
// twice under NoInbox: `idem demo messages` shows it, beside the inbox
// that prevents it.
//
// A failed attempt is retried and dead-lettered as under any inbox.
type NoInbox struct{}

var _ idem.Inbox = NoInbox{}

// Process implements idem.Inbox: it runs fn(ctx) and returns its error. It
// never returns idem.ErrDuplicate. An empty consumer or dedupKey, or a nil
// fn, is an *idem.ArgumentError, with nothing run, as for every inbox.
func (NoInbox) Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case dedupKey == "":
		return &idem.ArgumentError{Field: "dedupKey", Reason: "must not be empty"}
	case fn == nil:
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	return fn(ctx)
}
