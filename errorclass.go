package idem

import (
	"errors"
	"fmt"
	"time"
)

// ErrorClass says what kind of failure an attempt was.
type ErrorClass string

// Error classes.
const (
	// ClassTransient failures may succeed on retry: timeouts, a dependency
	// that is down. Any error not marked otherwise.
	ClassTransient ErrorClass = "transient"
	// ClassPermanent failures will fail again however often they are
	// retried: a malformed message, data it refers to that is gone.
	ClassPermanent ErrorClass = "permanent"
)

// Classify returns err's class: permanent when marked with Permanent,
// transient otherwise.
func Classify(err error) ErrorClass {
	if IsPermanent(err) {
		return ClassPermanent
	}
	return ClassTransient
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: retrying cannot help, so the message
// goes to the dead letters at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.err, e.delay)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err as transient with its own delay, such as a rate
// limit's: the next attempt waits d instead of the policy's backoff.
// RetryAfter(nil, d) is nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, delay: d}
}

// RetryDelay returns the delay err carries from RetryAfter, if any.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}
