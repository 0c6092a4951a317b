package idem

import (
	"context"
	"errors"
)

// ErrDuplicate is returned by Inbox.Process when the message was already
// processed: its handler did not run again.
var ErrDuplicate = errors.New("idem: duplicate: already processed")

// Inbox de-duplicates a consumer's messages in the database its effects
// live in.
type Inbox interface {
	// Process runs fn in one transaction of the inbox's database, in which
	// it also records (consumer, dedupKey). The context fn receives carries
	// that transaction (each inbox documents how to reach it), so fn's
	// writes and the record commit together, or not at all.
	//
	// Returns ErrDuplicate, without running fn, when the pair was already
	// recorded. Returns fn's error unchanged, after rolling back, when fn
	// fails: no record is left behind, so a redelivery runs fn again. On any
	// other error the commit may or may not have happened; a redelivery
	// finds out (ErrDuplicate, or fn runs).
	Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error
}
