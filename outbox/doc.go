// Package outbox relays the messages of a transactional outbox to a
// transport.
//
// A service writes the event that announces an effect into its outbox in
// the same transaction as the effect (idem.Outbox.Add with the
// transaction's context), so that the event exists if and only if the
// effect committed. A Relay then publishes the outbox's entries, oldest
// first, each under its own Message.ID (which the transports pass as the
// broker's message ID: JetStream Nats-Msg-Id, AMQP message_id), and marks
// them sent:
//
//	relay, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: transport})
//	if err != nil { … }
//	go relay.Run(ctx)
//	…
//	err = db.WithTx(ctx, func(ctx context.Context) error { …; return ob.Add(ctx, event) })
//	relay.Wake() // publish now rather than at the next poll
//
// # One pass
//
// Flush claims up to Config.Batch entries under a lease (idem.Outbox.Claim),
// publishes them in one idem.Publisher.Publish call, in order, and marks
// them sent. Run repeats passes: at once after a full batch, after
// Config.Interval (or a Wake) otherwise.
//
// When the Publisher is an idem.OutboxMover for the outbox (idempg's and
// idemsqlite's transports, in the outbox's own database), a pass is one
// MoveOutbox: the entries go from the outbox to the transport's queue in
// one transaction, and the duplicates below cannot happen.
//
// # Several relays, and the duplicate they may cause
//
// Several relays may run over one outbox at once, in one process or many:
// the lease keeps an entry another relay holds out of their claims, so in
// normal operation each entry is published once. Two things cause a
// duplicate, and the design accepts both, because consumers de-duplicate
// (idem.Inbox) and a lost message cannot be recovered:
//
//   - a relay that publishes and then dies (or fails to reach the outbox)
//     before MarkSent: its lease runs out, and the entry is published
//     again, by any relay, under the same message ID;
//   - a publish slower than Config.Lease: another relay may claim the
//     entries and publish them too.
//
// Brokers that de-duplicate by message ID within a window (JetStream's
// duplicate window) drop such a copy when it comes soon enough; otherwise
// the consumer's inbox absorbs it.
//
// # Observing
//
// Config.Observer sees every pass that relays something or fails (an idle
// poll is not reported): how many entries it sent, the messages it
// published (not for a MoveOutbox, which the relay does not see), how long
// the oldest of them waited, and its error. Package idemprom counts and
// times the passes (RelayObserver) and reads an outbox's backlog
// (RegisterOutbox); package idemotel makes a span of each pass linked to
// the spans that wrote its messages, whose trace context the entries keep
// in their headers.
//
// # Failures
//
// A failed publish is never dropped: the relay keeps the batch and
// publishes it again, before claiming anything else, after the backoff of
// Config.Retry, for as long as it takes, logging each failure. Keeping the
// batch keeps the outbox's order through a broker outage. A message the
// broker refuses for good therefore stops its relay: watch the logs, and
// the number of unsent entries.
//
// Order is the outbox's order for one relay. Several relays publish
// different batches concurrently, so messages of one key written close
// together may be published out of order; run a single relay when the
// consumers need the publish order of a key (the consumer package orders
// by delivery order).
package outbox
