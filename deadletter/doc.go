// Package deadletter is the service people act on dead letters through:
// what `idem dlq` and the UI call to list, show, re-drive and discard the
// messages a consumer (package consumer) gave up on.
//
//	svc, err := deadletter.New(&deadletter.Config{
//		DeadLetters: letters,
//		Ledger:      ledger,
//		Outbox:      outbox,
//		InTx:        db.WithTx, // idemmem.Transact for the in-memory stores
//	})
//	…
//	results, err := svc.Redrive(ctx, []string{"dl-42"}, &deadletter.RedriveOptions{
//		Actor:  "alice",
//		Reason: "the payment service is back",
//	})
//
// # Re-driving
//
// A dead letter in state dead is sent back to its consumer through the
// outbox, not published directly: in one transaction (Config.InTx), the
// message goes to the outbox, the key it held back is let go
// (idem.Ledger.LetGo) and the messages parked behind it go to the outbox
// after it, in their order, and the letter moves to idem.LetterRedriven
// with an event (who, why, "redriven" or "edited and redriven") in its
// history. If the process dies, either all of that happened or none; a
// relay (package outbox) publishes the messages in outbox order, so the
// key's order is kept: the re-driven message first, then the ones that
// waited for it.
//
// The state change comes last in the transaction: the store's refusal to
// resolve a letter that is no longer dead is what stops two people
// re-driving one letter at once, and it rolls the outbox writes back with
// it. Without a shared transaction (Config.InTx left nil) each write
// commits on its own, so a failure part-way can leave a message on the
// outbox twice, but never a letter marked re-driven whose message was not
// written.
//
// If the key's hold has moved to another letter (idem.Ledger.HoldBack
// moves it when a later message of the key is dead-lettered, as can
// happen when the consumer's policy changed from LetThrough to Park), the
// parked messages keep waiting for that letter: Result.HeldBehind names
// it, and nothing is released.
//
// Every letter of a call is checked first: an unknown ID
// (idem.ErrNotFound), a letter no longer dead (idem.ErrInvalidTransition),
// bad options (idem.ErrInvalidArgument) or a failing edit return an error
// naming the letter, and nothing is changed. RedriveOptions.DryRun reports
// what would happen, changing nothing; it lists the parked messages that
// would be released only with a shared transaction, which it rolls back.
//
// # Message IDs
//
// A re-driven message keeps its ID by default (KeepIDs), edited or not. A
// consumer that de-duplicates by message ID applies it once: it was never
// applied, so its inbox holds no row for it, and the same holds for the
// parked messages, which were set aside without being applied. Keeping the
// ID also keeps de-duplication working against a late copy of the
// original still in flight. An edit that must be applied even though the
// original was (it never is, for a dead letter) would need a new ID; pass
// one through RedriveOptions.Edit. A consumer that de-duplicates by a field
// of the body (the seed's event_id) is not affected by IDs at all; an edit
// must then keep that field.
//
// Brokers that drop a repeated message ID within a window drop a copy
// re-published too soon: NATS JetStream drops a publish whose Nats-Msg-Id
// it has seen within the stream's duplicate window (2 minutes by default),
// which is likely for parked messages released soon after they arrived.
// With such a broker, set Config.IDs to SuffixIDs: re-published messages
// get the ID "<id>~redrive-<n>" and the header HeaderOriginalID, and their
// consumer must de-duplicate by something that does not change: a body
// field, or DedupKey, which reads the header.
//
// # Discarding
//
// Discard gives letters up on purpose, with a reason (required) in their
// history, and releases the messages parked behind each to the outbox, in
// order, since they were waiting only on it.
//
// # Showing
//
// Render writes a letter for a person: its fields, its payload
// pretty-printed (indented JSON, plain text, or a hex dump), headers,
// attempts as a timeline, and history.
package deadletter
