// Package consumer is the de-duplicating consumer: it applies each message
// of a topic exactly once, in order per key, retries what failed
// transiently with jittered backoff, and moves what failed for good to the
// dead letters, with everything a person needs to decide what to do.
//
// It is built only on the root vocabulary (idem.Subscriber, idem.Inbox,
// idem.DeadLetters, idem.Ledger), so the same consumer runs on every
// transport and store:
//
//	c, err := consumer.New(&consumer.Config{
//		Name:        "settlement",
//		Topic:       "payments.succeeded",
//		Subscriber:  transport,
//		Inbox:       inbox,
//		DeadLetters: deadLetters,
//		Ledger:      ledger,
//	})
//	if err != nil { … }
//	err = c.Run(ctx, func(ctx context.Context, m idem.Message) error {
//		return addToSettlement(ctx, m) // joins the inbox's transaction
//	})
//
// # One delivery
//
// For each delivery the consumer derives the dedup key (Config.DedupKey,
// the message ID by default) and calls Inbox.Process with it (or records
// it with its batch, see Batches, or de-duplicates by aggregate and
// sequence number instead, see De-duplication keys). The handler runs
// inside the inbox's transaction, so its writes and the inbox row commit
// together or not at all:
//
//   - success: the delivery is acknowledged after the commit, or with it
//     where the transport joins the inbox's transaction. A crash between
//     the commit and an Ack after it causes a redelivery, which the inbox
//     absorbs.
//   - the inbox has the key already (idem.ErrDuplicate): acknowledged
//     without running the handler, and counted (Stats.Duplicates).
//   - failure: nothing was committed and no inbox row is left, so the next
//     attempt really runs again (unlike a de-duplicator that marks a message
//     seen before its handler runs).
//
// Where the handler's effect is idempotent by itself (it sets a state
// under a version it checks, or passes the message ID on to a service that
// de-duplicates by it), NoInbox records nothing and saves the inbox's
// write; every delivery then reaches the handler, and an effect that adds
// counts a redelivery twice.
//
// # De-duplication keys
//
// A message usually carries its key already, of one of two kinds. The
// first is an event ID: Config.DedupKey returns it (the message ID by
// default, or an ID from the payload, so that a copy re-published under
// another message ID is caught too), and the inbox keeps one row per
// message it processed.
//
// The second is the ID of the aggregate the message is about (an account,
// an order) and the message's sequence number within it (1, 2, 3, …, such
// as the aggregate's version). Config.Sequence returns them, and the
// consumer then de-duplicates with idem.SequenceInbox.ProcessSequence (the
// inbox must be one: idemmem's, idemsqlite's, idempg's and idemredis's
// are): the inbox keeps one mark per aggregate, the highest sequence
// number applied, raised in the handler's transaction. A message at or
// below its aggregate's mark is a duplicate, whatever its message ID, so a
// publisher that re-sends an aggregate's events under new IDs changes
// nothing; and the state is one row per aggregate, however many messages
// it had.
//
// A sequence number past the next one means the messages in between have
// not been applied. Under idem.GapHold (Config.Gap's default) the message
// waits for them: the inbox refuses it with an *idem.SequenceGapError, a
// transient failure, and the consumer hands it back to the transport with
// the retry delay (even when it has a Key: the messages that close the gap
// may be queued behind it, and must pass it), so it is applied once they
// have been, in order, and dead-lettered as exhausted only if the gap has
// not closed within Retry.MaxAttempts. Under the Park policy a gap below a
// message whose key is held back behind a dead letter is that letter's
// own: the message is parked behind it at once. Under idem.GapAllow the
// message is applied and the mark moves past the gap: a missing message
// that comes later is a duplicate. A Sequence that fails, panics or
// returns an empty aggregate or the number 0 makes the message malformed:
// it is dead-lettered at once as permanent.
//
// The dedup key still names the message where one is needed besides the
// inbox: the Ledger records its failed attempts under it, and Info carries
// it with the aggregate and the sequence number. Messages are handled one
// at a time under Sequence, never in batches: each needs its own look at
// its aggregate's mark, and the next message of an aggregate must see the
// mark the previous one left.
//
// # Batches
//
// When the inbox records many messages at once (idem.BatchInbox: idempg's
// and idemsqlite's), and Config.Sequence is not set, the consumer handles
// up to Config.BatchSize messages
// in one inbox transaction: their inbox rows, their handlers' writes and,
// on a database transport in the inbox's own database (its stream says so,
// idem.BatchStream.AcksInTx), their acknowledgements commit with one
// commit. That is a group commit: one durable flush for the batch instead
// of one per message, which is most of what a message costs. A handler
// stays a function of one message; it runs in the batch's transaction.
//
// A batch holds at most one message per dedup key, and, per ordering key,
// a run of the key's messages in their order: batches handled at once
// never share a key, so their handlers never touch one key's rows
// together. A message that fails takes no batch-mate with it: the batch
// is rolled back, the failing message (and the later messages of its key)
// taken out, and the rest applied again, at once, as a batch; the failing
// one is retried or dead-lettered on its own, as described below. Rolling
// back and trying again was preferred to a savepoint per message, which
// would cost a round trip of its own for every message and, past 64 of
// them in one transaction, slows every other session of a PostgreSQL
// server (its subtransaction cache overflows); failures are rare, so the
// optimistic batch costs less. A key found held back, or a malformed
// message, is likewise taken out and parked or dead-lettered on its own.
//
// Batches fill by themselves under load: a worker takes what is ready when
// it starts a batch, without waiting (Config.BatchWait, zero by default),
// so an idle consumer handles a lone message at once, and a busy one finds
// the messages that arrived while its previous batch committed. Where the
// transport hands out batches (idem.BatchStream), the consumer also takes
// deliveries BatchSize at a time, and acknowledges in one call the
// deliveries whose acknowledgement did not commit with their batch.
//
// Handlers that write rows shared across keys (one total for every
// message, say) keep those rows locked until the batch commits, so that
// concurrent batches wait for each other there; writing such rows in a
// fixed order, or in bulk with RunBatch and a BatchHandler, keeps them from
// waiting in a cycle. A BatchHandler gets the batch's new messages in one
// call, for effects that can be written with one statement; it names a
// failing message with an *ItemError so that the others are applied
// without it.
//
// # Failures and retries
//
// An error marked with idem.Permanent (a malformed message, a payment that
// does not exist) is dead-lettered at once, as is a message whose dedup
// key, or aggregate and sequence number, cannot be derived. Every other
// error, a handler's panic included, is transient: the attempt is
// recorded in the Ledger, and the message is
// tried again after the retry policy's delay (full jitter by default, see
// idem.RetryPolicy), or after the delay the error carries
// (idem.RetryAfter, for rate limits). An error of the inbox or the ledger
// is always transient, whatever it is marked: it says nothing about the
// message.
//
// Attempts are numbered max(Delivery.Attempt() - lapses excused,
// attempts recorded + 1): the transport's count and the Ledger both
// survive a restart, so a message does not get a fresh set of attempts
// because its consumer was redeployed. The lapses excused are the
// deliveries of the message that the consumer itself let go for a later
// one it held (see below), never attempted since the Ledger's last
// record: redeliveries that its own slowness caused, not attempts. Once
// Retry.MaxAttempts attempts have failed, the message is dead-lettered as
// exhausted. The handler reads the number with InfoFromContext.
//
// A message whose handling kills the process (a crash, an out-of-memory
// kill) never records a failure: it comes back after each AckWait, with
// the transport's count growing. Once that count passes MaxDeliveries
// (Retry.MaxAttempts + 5 by default), the consumer dead-letters it as
// exhausted without running the handler again, its reason saying it was
// delivered that often with no outcome recorded. So a poison message
// reaches the dead letters, instead of looping for good or being dropped
// by a broker's own delivery limit (RabbitMQ 4 drops a quorum queue's
// message after 20 deliveries). The count is the transport's less the
// lapses excused, as for the attempt number: a message queued behind a
// slow handler of its key, handed out again at each AckWait while the
// heartbeat is late, is handled once it reaches the head of its key, not
// dead-lettered. A lapse is excused only when the consumer held the
// delivery with no attempt of its own left unrecorded (queued, or waiting
// for a retry the Ledger recorded) and held its later delivery too,
// behind it in its key, when it let it go: the lapse of a delivery whose
// attempt outlasted the AckWait and was let go unrecorded counts (the
// handler might otherwise be run again and again, never dead-lettered),
// and so does every delivery before a restart, since nothing then tells a
// lapse from a crash.
//
// # Deliveries that are no longer the consumer's own
//
// A delivery can stop being the consumer's own while it works on it: its
// AckWait or lease ended (a stalled process, a long retry), or its Kafka
// partition was taken away by a rebalance or a lost session, and the
// message went to another holder. The transport then answers the
// delivery's calls with an error that matches idem.ErrStaleDelivery.
// Before it dead-letters a message, and before it hands one without a key
// back for its retry, the consumer asks (Delivery.InProgress): a delivery
// that is no longer its own is let go, unsettled, neither dead-lettered
// nor parked, and counted (Stats.Stale, OutcomeStale) and logged. Its new
// holder applies it, with the attempts recorded in the Ledger; a dead
// letter written from here would contradict it, and under Park hold its
// key back so that the new holder parks the very message it should apply.
// When the transport delivered the message again to the consumer itself
// (idemnats, after an AckWait), that later delivery, which it holds behind
// the key's messages that came in between, takes the stale one's place at
// the head of the key. It is recognised by its message ID and its dedup
// key, or, for a message whose publisher set no ID, by its dedup key
// (Config.DedupKey, read from the payload) alone. The heartbeat renews a
// delivery no more once the transport refused its renewal as stale (an
// InProgress's answer, or InProgressBatch's), and
// such a delivery that comes to the head of its key, with a later
// delivery of its message held behind it, is let go before it is handled
// (counted in Stats.Stale): on a loaded machine, whose heartbeats come
// late past the AckWait again and again, the copies of a message would
// otherwise take the head one after the other, each with its own inbox
// transaction and an acknowledgement the transport refuses, until the
// live delivery's AckWait too ended before its turn. The later delivery
// is excused the lapse (see Failures and retries): it does not count
// towards MaxDeliveries nor the attempt number. Otherwise the later
// messages of its key that the consumer holds are handed back with it
// (Nack), so that they do not overtake its next delivery: in the order of
// the messages, a later delivery of one in the place of its first, since
// JetStream delivers them again in the order of the NAKs; then those it
// was taking from the transport just then (Next had returned them, or
// returns them next), but for the stale message's own later delivery
// among them, which is the head of its key again. A keyed
// message waiting for a retry in memory is not let go before its retry:
// later messages of its key that the consumer holds may still be its own
// (a lease is per message), and would overtake it; the retry runs, and the
// inbox absorbs it if the new holder applied the message first. A
// transport that cannot tell a delivery handed to another holder (idemnats
// knows of one redelivered to the same stream, idemamqp of one it settled
// or whose channel closed)
// leaves such a delivery the consumer's, as before.
//
// # Order
//
// Messages with the same Key are handled one at a time, in the order the
// transport delivered them, even across retries; messages of other keys go
// on meanwhile, and messages without a key have no constraint at all. The
// consumer keeps, per key, a queue of the deliveries it holds; only the
// head of a queue is ever handled.
//
// A keyed message that failed waits for its retry inside the consumer, on
// a timer, keeping its place at the head of its key. It is not handed back
// to the transport with a Nack, because later messages of the key may
// arrive before the transport delivers it again: they would have to be
// held (or they would overtake it), and held deliveries could fill the
// memory the consumer allows itself (Config.MaxPending) so that it could
// not take the very delivery they wait for. With retries inside, every
// delivery the consumer holds can make progress by itself. A message
// without a key is Nacked with its delay instead, which frees its place,
// and so is a message held for a gap in its aggregate's sequence, which
// must be overtaken (see De-duplication keys): there the sequence number
// keeps the order, not the queue.
//
// Deliveries held longer than a moment (queued behind their key, waiting
// for a retry, or in a long handler) are kept alive with
// Delivery.InProgress every quarter of Config.AckWait, counted from when
// the transport handed them out, where its AckWait starts (however long
// the consumer took to put them behind their keys), so that the
// transport does not deliver them again meanwhile. On a stream that is an
// idem.BatchRenewer (idempg's, idemsqlite's, idemmem's), every delivery due
// is renewed with one InProgressBatch a beat, one round trip however many
// the consumer holds (up to Config.MaxPending), where one InProgress each
// could take longer than the AckWait on a loaded machine; the deliveries
// it reports stale are marked so, and a call that fails as a whole is made
// again, for them all, at the next beat. If the transport delivers one
// again anyway, the new delivery queues like any other and the inbox finds
// it a duplicate.
// A long retry delay therefore holds a delivery for that long: on RabbitMQ
// keep delays under the broker's consumer_timeout.
//
// The order holds within one running consumer. Across a crash it holds
// when the transport delivers the unsettled messages again before newer
// ones, as idemmem does and RabbitMQ does with the messages of a closed
// channel; a transport that redelivers only once AckWait has passed
// (JetStream) may hand newer messages of a key to the next run first.
// Several processes sharing one consumer name keep per-key order only if
// the transport gives each key to one of them.
//
// Which effects need the order: one that adds (a balance) ends with the
// right total in any order, but passes through states that never were (a
// refund before its payment, a negative balance); one that sets a state
// ("paid", then "refunded") ends wrong when a retry lets the earlier
// message land last, undoing the later one. A message that carries the
// final state with a version needs no order: with Config.Sequence under
// idem.GapAllow, a message older than what was applied is a duplicate, so
// the last state wins whatever the order of arrival. Such a consumer may
// set Config.Unordered, so that a key's messages no longer wait for each
// other. `idem demo messages` shows the four side by side.
//
// # Dead letters and parked keys
//
// A dead letter keeps the original message, the consumer's name, every
// attempt (time, class, error text) and the first and last failure. With
// Config.InTx the letter, the hold on its key and the removal of its
// recorded attempts commit in one transaction; the delivery is then
// terminated.
//
// Under the Park policy (the default), a dead-lettered message holds its
// key back: the later messages of that key are parked in the Ledger, in
// order, and acknowledged, without reaching the handler, until the dead
// letter is re-driven or discarded and the key is let go (Ledger.LetGo);
// whoever lets it go publishes the parked messages again, in order. Under
// LetThrough, they are handled as if the dead letter had not been there.
//
// # Resources and shutdown
//
// Config.Concurrency workers handle messages; at most Config.MaxPending
// deliveries are in memory, and the consumer stops calling Stream.Next
// when that many are, which is its backpressure. Run returns when its
// context is cancelled, once the handlers in flight have returned (their
// context is cancelled too). An attempt interrupted by the shutdown is not
// recorded, and deliveries not settled are not acknowledged: the transport
// delivers them again, to the next run.
//
// A transport that fails (a broker restarting, a database that stops
// answering) does not end Run: it subscribes again, spaced by
// Config.Resubscribe, and the deliveries it held come back from the
// transport (at once, or after their AckWait). Only a closed transport or
// an invalid subscription ends it with an error.
//
// # Inbox rows
//
// An inbox row must outlive every redelivery of its message: the inbox
// keeps it at least as long as the transport may deliver the message again
// (each inbox documents its retention, derived from the transport's own
// limits, such as a stream's maximum age). Sequence marks are kept for
// good: a mark that went would let every earlier message of its aggregate
// run again, and there is one per aggregate, not per message.
//
// # Observing
//
// Config.Observer sees the handling of every delivery: Begin when a worker
// takes it up (a Handler runs in the context it returns), End with its
// Outcome, the time it took and, for a message processed, its end-to-end
// lag from Message.Time. Package idemotel implements it with spans that
// continue the trace the message's headers carry, package idemprom with
// histograms; Observers puts both on one consumer. Nil observes nothing.
// Stats counts the same outcomes, for idemprom.RegisterConsumer.
//
// # Testing
//
// Time comes from Config.Clock and timers from Config.Timers, so a test
// drives retries and heartbeats by moving a manual clock instead of
// sleeping: idemmem.Clock is both, its timers firing when the test moves
// it.
package consumer
