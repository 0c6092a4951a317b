package idem

import "context"

// Ledger is a consumer's durable memory besides its inbox, kept in the same
// database so that it changes in the same transactions:
//
//   - the failed attempts of messages not yet settled, so the attempt count
//     and every attempt's error survive a consumer's restart, and a dead
//     letter can show them all;
//   - the ordering keys held back behind a dead letter, and the messages
//     parked behind each, so that a key's later messages are not applied
//     before an earlier one that failed.
//
// Every method joins the transaction carried by ctx (the inbox's, or the
// dead-letter store's) when there is one.
type Ledger interface {
	// RecordAttempt appends a failed attempt of the message consumer knows
	// as dedupKey and returns every attempt recorded for it, oldest first.
	RecordAttempt(ctx context.Context, consumer, dedupKey string, a Attempt) ([]Attempt, error)
	// Attempts returns the failed attempts recorded for the message.
	Attempts(ctx context.Context, consumer, dedupKey string) ([]Attempt, error)
	// ForgetAttempts deletes them: done once the message succeeded or was
	// dead-lettered (the dead letter keeps its own copy).
	ForgetAttempts(ctx context.Context, consumer, dedupKey string) error

	// HoldBack marks key as held back behind the dead letter letterID.
	HoldBack(ctx context.Context, consumer, key, letterID string) error
	// HeldBack reports whether key is held back, and behind which letter.
	HeldBack(ctx context.Context, consumer, key string) (letterID string, held bool, err error)
	// Park keeps m, whose key is held back, until the key is let go.
	// Parking the same message ID twice keeps one copy.
	Park(ctx context.Context, consumer string, m Message) error
	// LetGo clears the hold on key and returns the messages parked behind
	// it, in the order they were parked, removing them.
	//
	// A transaction that found the key held (HeldBack) and parks behind it
	// must not interleave with LetGo: either its parked message is among
	// those LetGo returns, or its HeldBack finds the key let go. A ledger
	// whose transactions do not serialise this on their own (idempg's, at
	// READ COMMITTED) locks the hold when HeldBack reads it in a
	// transaction.
	LetGo(ctx context.Context, consumer, key string) ([]Message, error)
}
