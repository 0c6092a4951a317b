package idem

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound is returned when a record does not exist or has expired.
	ErrNotFound = errors.New("idem: not found")

	// ErrLeaseLost is returned by Complete, Release, Renew and CompleteTx when the
	// caller's fencing token no longer holds the key: its lease ended and
	// another holder took the key over, or the key was completed or released.
	ErrLeaseLost = errors.New("idem: lease lost: the key is held under another token")

	// ErrHasRecoveryPoint is returned by a Recoverer's Release for a key in
	// flight with a recovery point: what its phases did past the
	// database's edge may have happened, and releasing it would let a new
	// request with the same key do it again. The key is left as it was.
	// Yield it, so that a retry or a Completer goes on from the point, or,
	// having learned that nothing happened, release it with
	// Recoverer.ReleaseWithPoint.
	ErrHasRecoveryPoint = errors.New("idem: the key has a recovery point: yield it, or release it with ReleaseWithPoint once nothing happened past the database")

	// ErrStaleDelivery is matched (with errors.Is) by the error a
	// Delivery's Ack, Nack, Term or InProgress returns once the delivery no
	// longer stands for its message: it was settled already, or the message
	// was handed to another consumer meanwhile (an AckWait or lease that
	// ended, a Kafka partition taken away by a rebalance, a redelivery). The
	// call changed nothing; the message's current holder settles it. Each
	// transport's own stale-delivery error (idemsqlite.ErrStaleDelivery,
	// idemkafka.ErrStaleDelivery, …) wraps it.
	ErrStaleDelivery = errors.New("idem: stale delivery")

	// ErrInvalidKey is matched (with errors.Is) by every *KeyError.
	ErrInvalidKey = errors.New("idem: invalid idempotency key")

	// ErrInvalidArgument is matched (with errors.Is) by every *ArgumentError.
	ErrInvalidArgument = errors.New("idem: invalid argument")
)

// KeyError says why an idempotency key was refused.
type KeyError struct {
	// Reason names what is wrong, in words a client developer can act on.
	Reason string
}

func (e *KeyError) Error() string { return "invalid idempotency key: " + e.Reason }

// Is makes errors.Is(err, ErrInvalidKey) true.
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }

// ArgumentError reports a malformed argument to a Store or other API.
type ArgumentError struct {
	Field  string
	Reason string
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("idem: invalid %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidArgument) true.
func (e *ArgumentError) Is(target error) bool { return target == ErrInvalidArgument }
