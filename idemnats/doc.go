// Package idemnats is an idem.Publisher and idem.Subscriber over NATS
// JetStream, through nats.go's jetstream package.
//
// # Topics, subjects, the stream
//
// A topic becomes a subject by the configured prefix: with the default
// prefix "idem", topic "payments.succeeded" is published to subject
// "idem.payments.succeeded", and a delivery's Topic is its subject without
// the prefix. All of them live in one stream, "IDEM" by default, which
// Open and New create with the subjects "<prefix>.>" when it does not
// exist (file storage, limits retention, nothing aged out unless
// Config.MaxAge says so). A stream that exists is left as it is, since its
// operators may have set its limits and replicas.
//
// A subscription is a durable pull consumer named after
// idem.Subscription.Consumer and filtered to its topic's subject, with
// explicit acknowledgement, its AckWait, MaxAckPending = MaxInFlight, and
// MaxDeliver from Config (unlimited by default). On its first creation it
// starts from the beginning of the stream, so nothing published before the
// first Subscribe is missed.
//
// # Which guarantee comes from where
//
// From JetStream, the broker:
//   - Durability. Publish waits for each message's PubAck: the stream has
//     stored it (on as many replicas as the stream has) before Publish
//     returns nil. Messages are published one at a time, each after the
//     previous one's PubAck, so a topic's messages are stored in the order
//     given, even when Publish is retried after a failure.
//   - De-duplication on publish. Message.ID travels as Nats-Msg-Id: the
//     stream drops a second message with the same ID within its
//     Duplicates window (2 minutes by default), acknowledging it as a
//     duplicate. That absorbs a relay's quick re-publish; a copy published
//     after the window, or under another ID, is delivered again, and only
//     the consumer's inbox catches it.
//   - At-least-once delivery with a count. The consumer keeps each
//     message's NumDelivered, reported as Attempt, across streams and
//     restarts of the application. A delivery not settled within AckWait
//     is delivered again.
//   - Settlement. Ack is a double ack: it returns once the server has
//     recorded it, so an acknowledged message does not come back. Nack is
//     a NAK, with the delay when there is one (NakWithDelay), after which
//     the server delivers the message again without holding up others;
//     Term is a TERM, after which it does not; InProgress resets the
//     AckWait. These three are flushed to the server before they return
//     but not confirmed: if one is lost, the AckWait brings the message
//     back, which is the safe side.
//
// From idem, above the transport: de-duplication beyond the window and
// across IDs (the consumer's inbox), the decision that a message is dead
// (the consumer package records every attempt; MaxDeliver is only a
// backstop, and a message past it is silently no longer delivered, so it
// defaults to unlimited), per-key order across retries, and the retry
// delays.
//
// # Next
//
// Next pulls one message per request, so a message is delivered, and its
// AckWait starts, only when a caller asks for it. A pull request waits at
// most Config.PollWait and expires before Next's context does, so a
// message published after Next gave up is not taken by an abandoned
// request. A request abandoned by Close or by a cancelled context may still
// be answered: that message comes back when its AckWait ends, with its
// Attempt one higher.
//
// # Headers
//
// Message.Headers travel as NATS headers, Message.Key in the Idem-Key
// header and a Message.Time set by the publisher in Idem-Time (otherwise a
// delivery's Time is when the stream stored the message). NATS headers are
// lines of "Name: value", so Publish refuses, with idem.ErrInvalidArgument,
// a header name that is empty or holds ':' or white space, a value (or ID
// or key) with a line break or a leading blank, and the names the
// transport or the server use: Nats-* (Nats-Msg-Id, Nats-Expected-*),
// Idem-Key and Idem-Time. Header names keep their case.
//
// # Server versions
//
// idemnats is tested against nats-server 2.9.10 and needs 2.9.0 or later:
// the consumer-create API with a filter subject in the request subject
// arrived in 2.9.0, and NAK with a delay in 2.7. It uses nothing newer:
// no multiple filter subjects or consumer metadata (2.10), no pull
// heartbeats (which the client asks for only on pulls of 10s or more,
// hence PollWait's bound), no per-message TTL or consumer pausing (2.11).
package idemnats
