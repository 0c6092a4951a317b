package idem

import (
	"context"
	"errors"
	"fmt"
)

// The second kind of de-duplication key. A consumer usually already has a
// key for each message: its event ID (Inbox.Process records one row per
// message), or the ID of the aggregate the message is about (an account, an
// order) with the message's sequence number within that aggregate, 1, 2,
// 3, …. With the second kind the receiver keeps one high-water mark per
// aggregate instead of one record per message: a sequence number at or
// below the mark was processed. That state never grows with the number of
// messages, it catches a copy re-published under a new message ID, and it
// tells a message that arrived early (a gap below it) from one that came
// twice.

// GapPolicy says what SequenceInbox.ProcessSequence does with a sequence
// number that skips past the one its aggregate's mark expects (seq >
// mark+1): the messages in between have not been processed.
type GapPolicy int

const (
	// GapHold refuses the message for now, with a *SequenceGapError: the
	// missing messages may still be in flight (a retry, a redelivery, a
	// slower partition), and applying this one first would break the
	// aggregate's order and, since the mark would pass them, make them
	// duplicates. A consumer retries it with backoff, and dead-letters it
	// only if the gap never closes.
	GapHold GapPolicy = iota
	// GapAllow applies the message and raises the mark past the gap: the
	// missing messages, should they come later, are duplicates. For
	// aggregates whose messages carry the final state, or whose sequence
	// numbers are not dense (a version that counts every change while only
	// some are published).
	GapAllow
)

func (p GapPolicy) String() string {
	switch p {
	case GapHold:
		return "hold"
	case GapAllow:
		return "allow"
	}
	return fmt.Sprintf("GapPolicy(%d)", int(p))
}

// ErrSequenceGap is matched (with errors.Is) by every *SequenceGapError.
var ErrSequenceGap = errors.New("idem: sequence gap: an earlier message of the aggregate has not been processed")

// SequenceGapError is what ProcessSequence returns, under GapHold, for a
// sequence number past the one its aggregate's mark expects. Nothing ran
// and nothing changed. It is transient: the missing messages may arrive,
// and then the same call succeeds.
type SequenceGapError struct {
	// Aggregate is the aggregate whose sequence has the gap.
	Aggregate string
	// Mark is the highest sequence number processed for Aggregate (0 when
	// none): Mark+1 is the one expected.
	Mark uint64
	// Seq is the sequence number refused.
	Seq uint64
}

func (e *SequenceGapError) Error() string {
	return fmt.Sprintf("idem: sequence gap in aggregate %q: got %d, expected %d", e.Aggregate, e.Seq, e.Mark+1)
}

// Unwrap makes errors.Is(err, ErrSequenceGap) true.
func (e *SequenceGapError) Unwrap() error { return ErrSequenceGap }

// SequenceInbox is an Inbox that also de-duplicates by aggregate and
// sequence number, keeping one mark per (consumer, aggregate): the highest
// sequence number processed, 0 when none. The marks are apart from
// Process's records: an aggregate and a dedupKey spelt the same never meet.
type SequenceInbox interface {
	Inbox
	// ProcessSequence runs in one transaction of the inbox's database, in
	// which it reads the mark of (consumer, aggregate), then:
	//
	//   - seq <= mark: returns ErrDuplicate without running fn;
	//   - seq == mark+1, or seq > mark+1 with GapAllow: runs fn, then sets
	//     the mark to seq, so fn's writes and the new mark commit together,
	//     or not at all;
	//   - seq > mark+1 with GapHold: returns a *SequenceGapError (matching
	//     ErrSequenceGap) without running fn, and changes nothing.
	//
	// The context fn receives carries that transaction, as Process's does
	// (each inbox documents how to reach it), and the values of ctx.
	// Returns fn's error unchanged, after rolling back, when fn fails: the
	// mark is left as it was, so a redelivery runs fn again.
	//
	// Calls for one (consumer, aggregate) are serialised from the read of
	// the mark to the commit (a row lock, the single writer, a lease), so
	// two calls at once never both run fn for sequence numbers at or below
	// one mark: the later reads the mark the earlier left, and is a
	// duplicate if the earlier committed that far, or runs if it rolled
	// back. Calls for other aggregates or consumers do not wait for each
	// other.
	//
	// A seq of 0 (sequence numbers start at 1), an empty consumer or
	// aggregate, a GapPolicy other than GapHold and GapAllow, or a nil fn
	// is an *ArgumentError, with nothing run or changed; a context done
	// before the commit commits nothing. On any other error the commit may
	// or may not have happened: a redelivery finds out (ErrDuplicate if it
	// did, fn runs if it did not).
	ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap GapPolicy, fn func(ctx context.Context) error) error
}

// CheckSequence is the decision every SequenceInbox makes once it holds
// the mark of aggregate: nil when seq may be applied on top of mark (it is
// mark+1, or past it with GapAllow), ErrDuplicate when seq <= mark, and a
// *SequenceGapError when seq skips past mark+1 under GapHold. Inboxes
// check their arguments (seq 0, an unknown GapPolicy) before they read the
// mark; CheckSequence takes them as valid.
func CheckSequence(aggregate string, mark, seq uint64, gap GapPolicy) error {
	switch {
	case seq <= mark:
		return ErrDuplicate
	case seq == mark+1 || gap == GapAllow:
		return nil
	}
	return &SequenceGapError{Aggregate: aggregate, Mark: mark, Seq: seq}
}

// CheckSequenceArgs returns the *ArgumentError ProcessSequence returns for
// its arguments, or nil when they are valid: so that every SequenceInbox
// refuses the same calls with the same words.
func CheckSequenceArgs(consumer, aggregate string, seq uint64, gap GapPolicy, fn func(ctx context.Context) error) error {
	switch {
	case consumer == "":
		return &ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case aggregate == "":
		return &ArgumentError{Field: "aggregate", Reason: "must not be empty"}
	case seq == 0:
		return &ArgumentError{Field: "seq", Reason: "must not be 0: sequence numbers start at 1"}
	case gap != GapHold && gap != GapAllow:
		return &ArgumentError{Field: "gap", Reason: fmt.Sprintf("must be GapHold or GapAllow, not %s", gap)}
	case fn == nil:
		return &ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	return nil
}
