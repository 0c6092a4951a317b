package idem

import "context"

// The interfaces of this file are optional: a transport, an inbox, a ledger
// or a publisher implements them when it can do many things in one round
// trip or one commit, and the consumer and outbox packages use them when
// they are there and fall back to the one-at-a-time methods when not. Each
// promises exactly what its one-at-a-time counterpart promises, for every
// item; only the cost differs.

// BatchStream is a Stream that hands out and acknowledges many deliveries
// in one round trip: the database transports take N rows with one
// statement, the brokers fetch N messages with one pull.
type BatchStream interface {
	Stream
	// NextBatch is Next for up to max deliveries: it blocks until at least
	// one is available, ctx is done (ctx.Err()) or the stream is closed
	// (ErrClosed), then returns the deliveries available at once, oldest
	// first, at least one and at most max. A max below 1 is an
	// *ArgumentError.
	//
	// A NextBatch that returns an error has handed nothing out: in
	// particular, a NextBatch interrupted by its context leaves no message
	// held for an AckWait, and no attempt counted, for a delivery nobody
	// received.
	NextBatch(ctx context.Context, max int) ([]Delivery, error)
	// AckBatch acknowledges ds, deliveries of this stream, in one go, and
	// returns how many it acknowledged. A delivery that no longer stands for
	// its message (settled already, or handed out again after its AckWait)
	// is passed over, not acknowledged, and is not an error: its next
	// holder settles the message. Where the transport can, AckBatch joins
	// the transaction ctx carries (see AcksInTx).
	AckBatch(ctx context.Context, ds []Delivery) (int, error)
	// AcksInTx reports whether AckBatch, called with ctx, joins the
	// transaction ctx carries, so that the acknowledgements commit (or roll
	// back) with it. Only then may a consumer acknowledge before its inbox
	// transaction commits; otherwise it must acknowledge after.
	AcksInTx(ctx context.Context) bool
}

// BatchRenewer is a Stream that renews the AckWait of many of its
// deliveries in one round trip: a consumer holding hundreds of deliveries
// renews them all with one call a heartbeat, where InProgress takes a round
// trip each, and on a loaded machine a pass of one-at-a-time renewals can
// outlast the AckWait it is meant to extend.
type BatchRenewer interface {
	Stream
	// InProgressBatch is InProgress for every delivery of ds, deliveries
	// of this stream, in one go: one statement on the database
	// transports. Each delivery that still stands for its message has its
	// AckWait start again; each that InProgress would refuse with
	// ErrStaleDelivery (settled, its AckWait ended, handed out again, its
	// stream closed) is renewed no more, changes nothing, and is named in
	// stale by its index in ds, in increasing order. A stale delivery is
	// not an error: the others of the call are renewed all the same, and
	// stale is empty when every delivery was. A transport whose
	// deliveries' settlements may be in flight in another transaction
	// (idempg) may pass such a delivery over rather than wait for it,
	// neither renewed nor reported stale: that settlement decides it.
	//
	// An error is about the whole call: stale is nil and no delivery was
	// renewed, or, where the transport cannot tell (an answer lost after
	// its commit), some may have been; none is known stale, so the caller
	// renews them again later, as it would after a failed InProgress. A
	// delivery of another stream is an *ArgumentError, with nothing
	// renewed; after the transport's Close, the call fails with ErrClosed.
	// An empty ds makes no round trip and returns nil, nil.
	//
	// Where the transport's InProgress joins the transaction ctx carries,
	// InProgressBatch does too, so that the renewals commit (or roll back)
	// with it.
	InProgressBatch(ctx context.Context, ds []Delivery) (stale []int, err error)
}

// BatchInbox is an Inbox that records many messages in one transaction of
// its database, so that N inbox records, N effects and one commit go
// together: a group commit, paid once for the batch.
type BatchInbox interface {
	Inbox
	// ProcessBatch records (consumer, k) for every k of dedupKeys, in one
	// transaction of the inbox's database, and runs fn in that transaction.
	// fresh[i] reports whether dedupKeys[i] was recorded now: when it is
	// false the message was processed already, and fn must not apply it
	// again. The context fn receives carries the transaction, as Process's
	// does, so fn's writes and the records commit together, or not at all.
	//
	// fn runs even when no key is fresh, so that it may acknowledge the
	// duplicates in the transaction. When fn returns nil, ProcessBatch
	// commits; when it fails, ProcessBatch rolls back and returns fn's
	// error unchanged, leaving no record behind. Concurrent calls that
	// share a key behave as concurrent Process calls do: the later waits
	// for the earlier transaction, and finds the key processed if it
	// committed, fresh if it rolled back.
	//
	// dedupKeys must be distinct and not empty: a repeated or empty key, an
	// empty consumer or a nil fn is an *ArgumentError, with nothing
	// recorded. On any other error, the commit may or may not have
	// happened, as with Process.
	ProcessBatch(ctx context.Context, consumer string, dedupKeys []string, fn func(ctx context.Context, fresh []bool) error) error
}

// BatchLedger is a Ledger that looks up the holds of many keys at once.
type BatchLedger interface {
	Ledger
	// HeldBackKeys returns, of keys, those held back, each mapped to the
	// dead letter it is held behind; keys not held back are absent. In a
	// transaction it reads as HeldBack does, so that a message parked in
	// the same transaction cannot interleave with a LetGo.
	HeldBackKeys(ctx context.Context, consumer string, keys []string) (map[string]string, error)
}

// OutboxMover is a Publisher that can move entries of an outbox kept in its
// own database straight into its queue, in one transaction: claiming,
// publishing and marking sent become one step, so a crash leaves the
// entries either moved or still waiting, and none is published twice.
type OutboxMover interface {
	Publisher
	// MoveOutbox moves up to limit of ob's oldest unsent entries, skipping
	// those another relay holds under a live lease, in the outbox's order,
	// and returns how many it moved. ok is false, and nothing is done, when
	// ob is not an outbox of the mover's database: the caller then relays
	// with Claim, Publish and MarkSent. A limit below 1 is an
	// *ArgumentError.
	MoveOutbox(ctx context.Context, ob Outbox, limit int) (moved int, ok bool, err error)
}
