package idem

import (
	"context"
	"time"
)

// OutboxEntry is a message waiting in an outbox.
type OutboxEntry struct {
	// Seq orders entries: the order they were added.
	Seq     int64
	Message Message
	// CreatedAt is when the entry was added.
	CreatedAt time.Time
}

// Outbox keeps messages written in the same transaction as the effect they
// announce, until a relay has published them.
type Outbox interface {
	// Add writes msgs in the transaction carried by ctx (the caller's own,
	// so the messages commit with the effect), or in a transaction of its
	// own when ctx carries none.
	Add(ctx context.Context, msgs ...Message) error
	// Claim leases up to limit unsent entries to relay, oldest first,
	// skipping those another relay holds under a live lease. The lease
	// keeps several relays from publishing one entry twice in normal
	// operation; a relay that crashes after publishing and before MarkSent
	// causes a duplicate, which consumers absorb.
	Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]OutboxEntry, error)
	// MarkSent records that entries were published.
	MarkSent(ctx context.Context, seqs ...int64) error
}
