package idemmem

import (
	"bytes"
	"context"
	"maps"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// OutboxConfig configures an Outbox. The zero value is ready to use.
type OutboxConfig struct {
	// Clock stamps entries' CreatedAt and decides whether a relay's lease
	// is live. Defaults to idem.SystemClock.
	Clock idem.Clock
}

// Outbox is an in-memory idem.Outbox. Add joins the Tx in its context (see
// Transact), so messages appear only if the effect they announce commits;
// their Seq is assigned when they appear, so Seq order is commit order and
// a relay never skips an entry that commits late. Sent entries are removed.
// The zero Outbox is not usable; call NewOutbox.
type Outbox struct {
	clock idem.Clock

	mu      sync.Mutex
	lastSeq int64
	// entries holds the unsent entries in Seq order.
	entries []*outboxEntry
}

var _ idem.Outbox = (*Outbox)(nil)

type outboxEntry struct {
	e idem.OutboxEntry
	// leaseUntil ends the lease of the relay that claimed the entry last.
	leaseUntil time.Time
}

// NewOutbox returns an empty Outbox. cfg may be nil.
func NewOutbox(cfg *OutboxConfig) *Outbox {
	var c OutboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	return &Outbox{clock: c.Clock}
}

// Add implements idem.Outbox. Returns an error matching
// idem.ErrInvalidArgument, having added nothing, when a message does not
// validate.
func (o *Outbox) Add(ctx context.Context, msgs ...idem.Message) error {
	for _, m := range msgs {
		if err := m.Validate(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	now := o.clock.Now()
	copies := make([]idem.Message, len(msgs))
	for i, m := range msgs {
		copies[i] = copyMessage(m)
	}
	return inTx(ctx, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		for _, m := range copies {
			o.lastSeq++
			o.entries = append(o.entries, &outboxEntry{e: idem.OutboxEntry{Seq: o.lastSeq, Message: m, CreatedAt: now}})
		}
	})
}

// Claim implements idem.Outbox. An entry under a live lease is skipped
// whoever holds it, the calling relay included, so a relay that claims
// again while it is still publishing does not get the same entries twice.
//
// Returns an error matching idem.ErrInvalidArgument when relay is empty,
// limit is less than 1 or lease is not positive.
func (o *Outbox) Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]idem.OutboxEntry, error) {
	switch {
	case relay == "":
		return nil, &idem.ArgumentError{Field: "relay", Reason: "must not be empty"}
	case limit < 1:
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be at least 1"}
	case lease <= 0:
		return nil, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := o.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []idem.OutboxEntry
	for _, e := range o.entries {
		if len(out) == limit {
			break
		}
		if now.Before(e.leaseUntil) {
			continue
		}
		e.leaseUntil = now.Add(lease)
		c := e.e
		c.Message = copyMessage(c.Message)
		out = append(out, c)
	}
	return out, nil
}

// MarkSent implements idem.Outbox: the entries are removed. Sequence
// numbers that are unknown, or already sent, are ignored, so marking is
// safe to repeat.
func (o *Outbox) MarkSent(ctx context.Context, seqs ...int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(seqs) == 0 {
		return nil
	}
	sent := make(map[int64]bool, len(seqs))
	for _, s := range seqs {
		sent[s] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	kept := o.entries[:0]
	for _, e := range o.entries {
		if !sent[e.e.Seq] {
			kept = append(kept, e)
		}
	}
	clear(o.entries[len(kept):])
	o.entries = kept
	return nil
}

// Unsent returns how many entries have not been marked sent, leased or
// not: a test waits for it to reach zero to know a relay has caught up.
func (o *Outbox) Unsent() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.entries)
}

// copyMessage returns a copy of m that shares no memory with it. A nil
// header map or payload stays nil.
func copyMessage(m idem.Message) idem.Message {
	m.Headers = maps.Clone(m.Headers)
	m.Payload = bytes.Clone(m.Payload)
	return m
}

// Backlog returns how many entries wait to be sent and when the oldest of
// them was added (the zero time when none waits), as the SQL outboxes do,
// for idemprom's outbox gauges.
func (o *Outbox) Backlog(ctx context.Context) (entries int, oldest time.Time, err error) {
	if err := ctx.Err(); err != nil {
		return 0, time.Time{}, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.entries) > 0 {
		oldest = o.entries[0].e.CreatedAt
	}
	return len(o.entries), oldest, nil
}
