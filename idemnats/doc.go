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
// exist (file storage, limits retention, no limits, Discard new, nothing
// aged out unless Config.MaxAge says so). A stream that exists is left as
// it is, since its operators may have set its limits and replicas; but
// Open and New inspect it, and its consumers, and report in
// Transport.Warnings (and to Config.Logger) every setting that can drop a
// message before its consumers have it, as the table below lists.
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
//   - Durability. Publish waits for every message's PubAck: the stream has
//     stored it (on as many replicas as the stream has) before Publish
//     returns nil. Publish pipelines: it sends up to Config.PublishWindow
//     messages (256 by default) ahead of their PubAcks, in order on one
//     connection, so the stream stores them in the order given.
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
//     a NAK, with the delay when there is one, after which the server
//     delivers the message again without holding up others; Term is a
//     TERM, after which it does not; InProgress resets the AckWait. These
//     three are flushed to the server before they return but not
//     confirmed: if one is lost, the AckWait brings the message back,
//     which is the safe side.
//
// From idem, above the transport: de-duplication beyond the window and
// across IDs (the consumer's inbox), the decision that a message is dead
// (the consumer package records every attempt; MaxDeliver is only a
// backstop, and a message past it is silently no longer delivered, so it
// defaults to unlimited and is reported when set), per-key order across
// retries, and the retry delays.
//
// # Settings that can drop a message
//
// JetStream removes a message when a limit or the retention says so,
// whether its consumers have it or not, without telling anyone: such a
// message never reaches a consumer, nor idem's dead letters. What each
// setting means for idem's promise that nothing is lost, and what the
// transport sets on the stream it creates (a stream that exists keeps its
// own, reported when they can drop):
//
//	Setting      Meaning                                           idem sets / reports
//	-----------  ------------------------------------------------  ----------------------------
//	MaxDeliver   (a consumer's) after that many deliveries the     Config.MaxDeliver, 0 by
//	             server stops delivering a message to the          default: unlimited, so the
//	             consumer, without a word; it stays in the stream  consumer package decides.
//	             but reaches idem's dead letters only if the       Reported when set, on idem's
//	             consumer package gave it up first                 consumers and on others
//	MaxAge       a message older than that is removed, consumed    Config.MaxAge, 0 by default:
//	             or not: a consumer stopped longer loses it        kept. Reported when set
//	Discard      what a full stream does (MaxMsgs, MaxBytes):      new: the publish is refused,
//	             old removes its oldest message, consumed or not;  Publish fails and the outbox
//	             new refuses the new one                           retries. Old is reported
//	                                                               with the limit it applies to
//	MaxMsgsPer-  a subject past that many removes its oldest,      none. Reported unless Discard
//	Subject      whatever Discard says, unless Discard new and     new and DiscardNewPerSubject
//	             DiscardNewPerSubject
//	Duplicates   window in which a second message with the same    Config.Duplicates, or the
//	             Nats-Msg-Id is acknowledged and not stored: a     server's 2 minutes. Not
//	             copy of one stored, since an ID names a message   reported: it loses nothing
//	Retention    limits keeps a message until a limit removes it;  limits. Interest and work
//	             interest removes one no consumer matches when it  queue are reported
//	             is published, and one every matching consumer
//	             has acknowledged (a consumer name subscribed later
//	             never has it); work queue removes one at its
//	             first acknowledgement and refuses overlapping
//	             consumers
//	Storage      memory storage loses every message when the       file. Memory is reported
//	             server restarts
//	Replicas     on a cluster, a stream of 1 replica loses its     Config.Replicas (1 by
//	             messages with its server's disk; one of 2 stops   default). Reported below 3
//	             taking publishes when one server is lost          on a cluster
//
// A refused publish is never a loss: Publish returns the error, and the
// outbox relay keeps the message and publishes it again later. The stream
// the transport creates has no limits at all, so Discard new only
// matters once its operators add some; a stream that an earlier version
// created has Discard old, which drops nothing until the stream gets a
// limit, and is reported then. Warnings lists what Open or New found,
// and the MaxDeliver of each consumer Subscribe has made since.
//
// # Order when a Publish fails
//
// With more than one message in flight, a failure in the middle of a
// Publish (a connection lost, a stream leader that changed) can lose one
// message while later ones of the call are stored; publishing the call
// again then stores the lost one after them. Consumers de-duplicate, so
// nothing is applied twice, but a key's messages can arrive out of order.
// (For that reason a message the stream did not answer, "no responders",
// fails the Publish rather than being sent again behind the others, as
// nats.go would.) Config.PublishWindow 1 sends each message only after
// the previous one's PubAck, as the transport did before it pipelined,
// and keeps the order across such failures, at one round trip per
// message; nats.go then resends a message without responders twice,
// 250ms apart, before Publish fails.
//
// # Next and NextBatch
//
// Next and NextBatch send a pull request when called, for one message or
// for up to max, so a message is delivered, and its AckWait starts, only
// when a caller asks for it. NextBatch's request is a no_wait request with
// an expiry, which the server answers as soon as it has a message, with
// every other one available then, and ends at once after them, without
// waiting to fill the batch. The server refuses such a request while the
// consumer's other waiting requests (another stream's, of the same
// consumer name) ask for more than there is ("Requests Pending"), and
// NextBatch then pulls one message. At the consumer's MaxAckPending the
// server hands out what room allows and keeps the request waiting, so
// NextBatch returns when acknowledgements have made room for the rest or
// the request expires (after Config.PollWait at most).
//
// A pull request belongs to the stream, not to the call that sent it: a
// stream has one out at a time, and its calls share what it brings, in
// the stream's order. A request expires before the deadline of the call
// that sent it, so that a call with a deadline leaves nothing behind. A
// call that gives up earlier (its context cancelled) leaves its request
// out, and what it brings goes to the stream's next call; what it brings
// with no call waiting is handed back with a NAK once the request has
// ended, and so delivered again at once rather than after its AckWait,
// though the server has counted that delivery, and its Attempt is one
// higher. A request is not withdrawn earlier because nats-server before
// 2.10.14, finding a redelivery due and only a request that has lost its
// interest waiting, delivers the stream's previous message again as new
// and loses the redelivery until its AckWait (nats-server#5305).
//
// Close does withdraw the stream's request: it unsubscribes the reply
// subject, which makes the server drop the request, asks for the
// consumer's info, which makes a 2.9 server drop it at once, and hands
// back with a NAK what the request had brought; the NAKs are confirmed
// before the stream pulls again, so the messages keep their place. A
// message sent in the very moment of the withdrawal can still miss both
// and come back only after its AckWait.
//
// AckBatch sends the acknowledgements of a batch at once, plain ones and
// a double ack last, and waits for that one's confirmation: one round trip
// for the batch. The server processes a consumer's acknowledgements in
// the order they arrive, so the last one's confirmation says every one is
// recorded. AckBatch passes over deliveries settled already, and those
// whose message this stream has received again after their AckWait; a
// later delivery to another stream cannot be told, and acknowledging the
// earlier one settles the message, since JetStream acknowledges by stream
// sequence. A broker cannot join a database transaction: AcksInTx is
// false.
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
// # Clusters
//
// Open takes the client URLs of a cluster's servers, comma-separated
// ("nats://a:4222,nats://b:4222,nats://c:4222"); the connection goes to
// one and, should it be lost, reconnects to another. A stream the
// transport creates has Config.Replicas replicas (1 by default, what a
// single server needs); on a cluster give it 3: a PubAck then means a
// majority of the three servers stored the message, and the stream goes
// on when one is lost. On a cluster (the server reports a cluster name),
// a stream with fewer than 3 replicas, created or found, is reported in
// Warnings with the setting "Replicas".
//
// What a lost server does, measured by TestClusterNATS (three nats-server
// 2.9.10 processes on one machine, a stream of 3 replicas, 8 keys of 40
// events each, the stream's leader killed with SIGKILL a third of the way
// and restarted at two thirds; IDEMTEST_CLUSTER_SCALE lengthens it):
//   - Publishes stall while the cluster elects a new leader (4 to 8
//     seconds here); each one that fails or times out is sent again with
//     the same Nats-Msg-Id, and the stream, which replicates its
//     de-duplication window, stores every event once: no acknowledged
//     event was lost, none was stored twice.
//   - The consumer's deliveries can be handed out of a key's order: a
//     message the old leader delivered in a pull response that never
//     arrived comes back only after its AckWait, behind its key's later
//     messages. A consumer that de-duplicates by message ID applies each
//     as it comes (counted as out-of-order effects, none or a few per
//     run); one with consumer.Config.Sequence (the key and its sequence
//     number, gaps held) waits for the missing message, and applied every
//     key in order in every run.
//   - The inbox absorbs what is delivered twice (an acknowledgement lost
//     with the leader): no effect was applied twice.
//
// A killed process loses nothing a PubAck confirmed: what the server
// wrote is in the operating system's page cache and reaches the disk
// anyway. A power loss or a kernel crash is different. nats-server
// fsyncs its stream files every 2 minutes by default, and acknowledges
// before it has, so a message acknowledged within that interval is only
// in memory: lost if its single server crashes so, or a majority of its
// replicas at once (Jepsen lost acknowledged writes this way). The
// jetstream block's sync_interval: always, from nats-server 2.10 (2.9
// refuses the setting and always syncs every 2 minutes), fsyncs before
// every acknowledgement, at a cost in throughput. No client can read the
// servers' sync policy (only their monitoring port shows it), so the
// transport takes Config.SyncAlways as the operator's word for it, and
// otherwise DurabilityWarnings reports it, wrapping ErrSyncUnconfirmed.
// TestClusterNATS measures the failover with sync_interval: always too
// when IDEMTEST_NATS_SERVER names a 2.10 or later server, and skips that
// part, saying so, on 2.9.
//
// # Server versions
//
// idemnats is tested against nats-server 2.9.10 and needs 2.9.0 or later:
// the consumer-create API with a filter subject in the request subject
// arrived in 2.9.0, NAK with a delay in 2.7, and no_wait pull requests
// with an expiry, which end once the available messages are delivered,
// in 2.7 too (2.9 ends them with a 408 status, later servers with a 404;
// either will do). It uses nothing newer: no multiple filter subjects or
// consumer metadata (2.10), no pull heartbeats (a pull lasts at most
// Config.PollWait, under 10s, and does without), no per-message TTL or
// consumer pausing (2.11).
package idemnats
