package idem

import (
	"context"
	"time"
	"unicode/utf8"
)

// RecoveryPoint records how far an execution of a key got: the phase it
// reached and what the next phases need. An execution whose work calls out
// of its own database (a card network, another service) saves one with
// each phase's local writes, in the same transaction; a later execution of
// the key (a client's retry, a takeover on another replica, or a Completer
// that nobody asked) reads it and goes on from there instead of starting
// over.
type RecoveryPoint struct {
	// Name is the phase reached ("charging", "recorded"). Empty: none.
	Name string
	// Data is what resuming needs (a charge's ID, the request's
	// parameters). It is stored as it is given; keep it small.
	Data []byte
	// SavedAt is when the point was saved, by the store's clock. Stores
	// set it; SaveRecovery ignores the caller's.
	SavedAt time.Time
}

// IsZero reports whether rp names no phase: the execution saved none.
func (rp RecoveryPoint) IsZero() bool { return rp.Name == "" }

// Limits of a RecoveryPoint every store accepts.
const (
	MaxRecoveryNameLen = 100
	MaxRecoveryDataLen = 64 << 10
)

// Validate reports whether rp can be saved, naming what cannot.
func (rp RecoveryPoint) Validate() error {
	switch {
	case rp.Name == "":
		return &ArgumentError{Field: "RecoveryPoint.Name", Reason: "must not be empty"}
	case len(rp.Name) > MaxRecoveryNameLen:
		return &ArgumentError{Field: "RecoveryPoint.Name", Reason: "must be at most 100 bytes"}
	case !utf8.ValidString(rp.Name):
		return &ArgumentError{Field: "RecoveryPoint.Name", Reason: "must be valid UTF-8"}
	case len(rp.Data) > MaxRecoveryDataLen:
		return &ArgumentError{Field: "RecoveryPoint.Data", Reason: "must be at most 64 KiB"}
	}
	for _, c := range rp.Name {
		if c < 0x20 || c == 0x7f {
			return &ArgumentError{Field: "RecoveryPoint.Name", Reason: "must not contain control characters"}
		}
	}
	return nil
}

// Recoverer is a Store that keeps recovery points with its keys, and finds
// the executions nobody is finishing.
//
// What a store with recovery points promises, beyond Store:
//
//   - A recovery point lives in the key's record. A takeover keeps it, and
//     the Claim's Record carries it to the next execution; a key claimed
//     anew (absent, or expired while not held) starts with none.
//   - A key in flight with a recovery point never expires: past its TTL it
//     stays in flight (Get returns it, a Claim sees it, Purge keeps it)
//     until an execution completes or releases it. Whatever its phases did
//     past the database's edge may have happened, so forgetting the key
//     would let a new request with the same key do it again.
//   - Release refuses such a key (ErrHasRecoveryPoint), whoever asks: a
//     failure after a point is answered by Yield, so that the next
//     execution goes on from it. Releasing it is a decision apart,
//     ReleaseWithPoint, for a caller that learned that nothing happened
//     outside (a Completer whose Resume returned ErrNothingDone).
type Recoverer interface {
	Store

	// SaveRecovery sets the key's recovery point (replacing any earlier
	// one) if ref.Token holds it in flight. Called with a context that
	// carries a transaction of the store's database (a TxStore's CompleteTx,
	// the backend's WithTx), it writes in that transaction, so the point
	// commits or rolls back with the phase's own writes; otherwise it
	// commits on its own.
	//
	// Returns an *ArgumentError for a point that fails Validate, and
	// ErrLeaseLost when the key is not in flight under ref.Token, having
	// changed nothing. On any other error the point may or may not have
	// been saved; saving it again is safe.
	SaveRecovery(ctx context.Context, ref Ref, rp RecoveryPoint) error

	// Yield ends ref's lease now, if ref.Token holds the key in flight,
	// and keeps everything else: the key stays in flight with its recovery
	// point, and the next Claim with its fingerprint takes it over at once
	// and goes on from the point (a Completer's next round lists it). An
	// execution that failed after saving a point yields rather than
	// releases: it is over, but what it did past the database's edge is
	// not known to be undone. It wakes the key's waiters as a release does.
	//
	// Returns ErrLeaseLost when ref.Token does not hold the key in flight,
	// having changed nothing. On any other error the lease may or may not
	// have ended; it ends on its own anyway.
	Yield(ctx context.Context, ref Ref) error

	// ReleaseWithPoint releases ref's key, in flight under ref.Token,
	// recovery point and all, as Release does a key without one: the next
	// Claim runs the effect anew. Call it only once nothing the key's
	// phases did past the database's edge has happened, or all of it was
	// undone. Releasing a key that is already gone succeeds, so a retry
	// after an ambiguous failure is safe.
	//
	// Returns ErrLeaseLost when the key is held under another token or was
	// completed, having changed nothing.
	ReleaseWithPoint(ctx context.Context, ref Ref) error

	// Abandoned lists up to limit keys in flight whose lease has ended and
	// that carry a recovery point, oldest lease end first: executions that
	// reached a phase and whose holder is gone, which a Completer takes
	// over. Keys without a recovery point are not listed: nothing says how
	// to go on with them, and a client's retry takes them over as before.
	// limit must be positive.
	Abandoned(ctx context.Context, limit int) ([]Record, error)
}
