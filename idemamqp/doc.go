// Package idemamqp is an idem.Publisher and idem.Subscriber over RabbitMQ
// (AMQP 0-9-1), through amqp091-go.
//
// # Exchange, routing keys, queues
//
// Messages are published to one durable topic exchange, "idem" by
// default, with the topic as routing key. A subscription is a durable
// queue named "<QueuePrefix>.<consumer>" ("idem.settlement" for consumer
// "settlement"), a quorum queue unless Config.ClassicQueues, bound to the
// exchange with the topic as binding key, so '*' and '#' match as in any
// topic exchange. One consumer name is one queue: give each topic its own
// consumer name. Several streams of one consumer name compete for the
// queue's messages. A quorum queue has a second one beside it,
// "<queue>.limit", for the messages RabbitMQ gives up past its delivery
// limit (see below), which the subscription consumes too.
//
// RabbitMQ routes a message only to the queues bound when it is published:
// subscribe (which declares the queue) before publishing what the
// subscription must receive. A message no queue is bound to is dropped, as
// AMQP specifies, unless Config.Mandatory, with which Publish returns
// ErrUnroutable for it instead.
//
// # Which guarantee comes from where
//
// From RabbitMQ, the broker:
//   - Durability. Publish uses publisher confirms and persistent delivery
//     mode, and returns nil only once the broker has confirmed every
//     message: a quorum queue has it on a majority of its replicas, a
//     classic durable queue on disk. A nack, or a channel that closes
//     before the confirm, is ErrNacked: the message may or may not be
//     stored, and publishing again is safe.
//   - Order. A queue delivers in the order messages were routed to it;
//     requeued and delayed messages come back later, out of it.
//   - At-least-once delivery. A delivery is settled with basic.ack, by
//     Ack and by Term alike: the consumer that gives a message up has put
//     it in idem's dead letters already, and a quorum queue would
//     dead-letter a rejected message to "<queue>.limit", to be delivered
//     again. A delivery left unsettled when its channel closes, or its
//     connection drops, goes back to the queue at once.
//   - The attempt count, on quorum queues: RabbitMQ counts the times a
//     message went back to the queue in x-delivery-count, and Attempt is
//     one more. Classic queues only flag a redelivery, so Attempt is 2 for
//     any redelivery there (a lower bound); the consumer package then
//     relies on its own record of attempts.
//
// Not from RabbitMQ, and so not offered:
//   - De-duplication. message_id is set to Message.ID, but RabbitMQ does
//     not de-duplicate by it: every copy published is delivered, and the
//     consumer's inbox absorbs it.
//   - An ack deadline. RabbitMQ does not redeliver a message a live
//     consumer holds, however long: Subscription.AckWait is not used, and
//     InProgress extends nothing; it only says whether the delivery is
//     still the consumer's own (not settled, its channel open). Only
//     consumer_timeout (30 minutes by default, a broker setting) closes a
//     channel that holds a delivery longer, which puts the message back.
//   - A per-message delay. See below.
//
// From idem, above the transport: de-duplication (the inbox), the decision
// that a message is dead (the consumer package; a broker's delivery limit
// only hands the message to it counted as exhausted, see below), per-key
// order across retries, and the retry delays.
//
// # Delivery limits and <queue>.limit
//
// A quorum queue counts the returns of each message and, past its
// delivery limit, gives the message up: it drops it, or dead-letters it
// where the queue names a target. The limit is Config.DeliveryLimit when
// set (x-delivery-limit); unset, it is none on RabbitMQ 3.x and 20 on
// RabbitMQ 4.0 and later, and a policy's delivery-limit applies too (the
// lowest wins). A message that crashes its consumer again and again, so
// that the consumer never records an outcome, reaches it. Classic queues
// (Config.ClassicQueues) have no delivery limit and none of what follows.
//
// So that nothing is dropped whatever limit applies, every consumer's
// quorum queue is declared with a dead-letter target: the durable quorum
// queue "<queue>.limit", through the default exchange
// (x-dead-letter-exchange "" and x-dead-letter-routing-key
// "<queue>.limit"), with x-dead-letter-strategy at-least-once, by which the
// queue keeps the message until the limit queue has confirmed it. That
// strategy needs x-overflow reject-publish (RabbitMQ falls back to at
// most once with drop-head), which matters only under a length limit, and
// idem sets none: a queue that a policy gives one, once full, refuses new
// messages instead of dropping its oldest, so Publish returns ErrNacked
// and an outbox relay keeps the message and publishes it again later (a
// message routed to several queues may then have been stored by the
// others, which deliver the copy again: the inbox absorbs it). Messages
// given up wait in the queue while "<queue>.limit" cannot take them (a
// length limit there, or the queue deleted): do not delete it while its
// queue lives.
//
// The limit queue has no dead-letter target of its own: RabbitMQ drops a
// message dead-lettered round a cycle without a rejection (back to the
// queue or to itself), and a further queue would need one in turn.
// Instead its x-delivery-limit is 2^31-1, out of reach, which overrides
// RabbitMQ 4's default; a policy's lower delivery-limit would still apply
// to it, so keep such policies off the "*.limit" queues.
//
// The subscription consumes "<queue>.limit" on its channel beside the
// queue, with the same prefetch, and hands its messages out like any
// other delivery, with their topic (from the x-death header) and their
// attempts: the deliveries the limit allowed, Config.DeliveryLimit + 1 or,
// unset, RabbitMQ 4's 20 + 1 (more than a policy's lower limit allowed:
// the message is past the broker's patience either way), plus one for
// each delivery from the limit queue. The consumer package numbers the
// attempt with at least that count, so the message is exhausted whenever
// the count has reached Retry.MaxAttempts (10 by default, below RabbitMQ
// 4's 21): the consumer runs the handler once more, acknowledges the
// message if that succeeds, and otherwise dead-letters it as exhausted at
// once and settles it (with a higher MaxAttempts the message gets the
// rest of its attempts, as any other would). Should the handler
// crash the consumer again, the message goes back to "<queue>.limit" and
// stays in the broker, delivered at each restart, until it is settled:
// never dropped, and visible as the limit queue's depth, which deserves an
// alert. A delayed Nack of it goes back through a delay queue into the
// consumer's queue, its attempts carried in Idem-Attempts.
//
// A queue declared by an earlier version of the transport has no
// dead-letter target, and RabbitMQ refuses to change the arguments of an
// existing queue (PRECONDITION_FAILED, which closes the channel). The
// transport then declares the queue passively, and as that version did,
// which still refuses another queue type or delivery limit, goes on with
// it, and
// reports it in Transport.Warnings (and to Config.Logger) as
// ErrNoDeadLetterTarget, with the policy that gives the queue its target:
//
//	rabbitmqctl set_policy 'idem.c.limit' '^idem\.c$' \
//	  '{"dead-letter-exchange":"","dead-letter-routing-key":"idem.c.limit","dead-letter-strategy":"at-least-once","overflow":"reject-publish"}' \
//	  --apply-to queues
//
// RabbitMQ applies one policy to a queue, the one of highest priority:
// merge these keys into a policy that already matches it. The limit queue
// is declared and consumed for such a queue too, so the policy takes
// effect at once.
//
// # Delayed Nack
//
// Nack without a delay is basic.reject with requeue: the message goes back
// to the queue at once and its x-delivery-count grows. RabbitMQ has no
// per-message delay, so Nack with a delay publishes a copy of the message
// (same ID, body, properties and headers) to a delay queue of the
// consumer's and then acknowledges the original. The delay queue,
// "<queue>.delay.<ms>", has a message TTL of the delay and dead-letters
// expired messages through the default exchange back into the consumer's
// queue only (not to other consumers of the topic). Delays are rounded up
// to five significant bits of milliseconds (at most 1/16 longer, never
// shorter), so that one consumer's delays share a few dozen queues, and
// every message of a queue has the same TTL: RabbitMQ expires messages only
// at the head of a queue, so a queue of mixed TTLs would hold short delays
// behind long ones. A delay queue is declared again on each use and expires
// (x-expires) when unused for twice its TTL plus ten minutes, after every
// copy in it has gone back.
//
// The guarantees of that choice, rather than sleeping and requeueing in
// the client (which holds the delivery, and a prefetch slot, for the whole
// delay, and loses the delay if the consumer stops):
//   - The copy is published with a confirm before the original is
//     acknowledged, so a crash in between delivers the message twice
//     (absorbed by the inbox), never zero times.
//   - When the copy fails (its queue cannot be declared, or the broker
//     does not confirm it within five seconds), the original is requeued
//     at once instead (basic.reject with requeue), without its delay, and
//     the Logger is told: a delivery left unsettled would come back only
//     once its channel closed, and hold a prefetch slot until then.
//   - With quorum queues the delay queue is a quorum queue with
//     at-least-once dead-lettering (RabbitMQ 3.10 or later), so the copy
//     survives a broker restart and its way back. With classic queues the
//     delay queue is classic and dead-lettering is at most once: a broker
//     crash at that moment can lose the copy.
//   - A delay queue whose at-least-once dead-lettering RabbitMQ failed to
//     start at boot keeps its expired copies, neither lost nor delivered,
//     and their keys wait for them. RabbitMQ 3.10 does that now and
//     then after an unclean stop, logging at boot that it "Cannot forward
//     any dead-letter messages from source quorum queue" because the
//     default exchange "does not exist" (rabbitmq-server#12625); such a
//     queue shows more messages than ready and unacknowledged ones
//     together in `rabbitmqctl list_queues name messages messages_ready
//     messages_unacknowledged`.
//   - The copy is a new message to RabbitMQ, whose x-delivery-count starts
//     again: the deliveries before it travel in the Idem-Attempts header,
//     and its topic in Idem-Topic (its routing key became the queue's
//     name), so Attempt and Message.Topic continue across the delay.
//
// # Batches
//
// A stream is an idem.BatchStream. RabbitMQ pushes deliveries to the
// consumer up to the prefetch (Subscription.MaxInFlight, or
// Config.MaxInFlight, 300 by default), so NextBatch waits for the first
// delivery as Next does and then takes those already in the client, up to
// max, without waiting for more. AckBatch acknowledges a batch with as
// few frames as it can: basic.ack with multiple set settles every
// unsettled delivery of the channel up to its tag, so AckBatch sends one
// for the deliveries of the batch that are all the channel's unsettled
// deliveries below some tag (counting those handed out to others and
// those still waiting in the client), and one basic.ack each for the
// rest. A batch the consumer handles in order and acknowledges whole
// takes one frame; one with a message held back, or retried, takes one
// for the run before it and one each after. basic.ack has no answer, so
// AckBatch, like Ack, returns once its frames are written; a delivery
// whose channel has died is passed over, since the broker has put its
// message back. A broker cannot join a database transaction: AcksInTx is
// false.
//
// Publish pipelines as well: up to Config.PublishWindow (256) messages of
// one call await their confirms at once.
//
// # Headers and properties
//
// Message.ID is message_id; Message.Headers are AMQP headers (strings);
// Message.Key travels in Idem-Key and Message.Time in Idem-Time (RFC 3339
// with nanoseconds), besides the timestamp property, which holds seconds
// only; a message published without a Time gets the Clock's. Publish
// refuses, with idem.ErrInvalidArgument, header names of more than 255
// bytes and the reserved names: those beginning with "x-", which belong to
// RabbitMQ (x-death, x-delivery-count), and Idem-Key, Idem-Time,
// Idem-Topic and Idem-Attempts.
//
// # Connections
//
// The Transport holds one connection, with a channel in confirm mode for
// publishing and one channel per stream. When it finds the connection
// closed it dials again; a stream whose channel died subscribes again once,
// in Next or NextBatch, and returns an error if that fails. Deliveries of
// the dead channel cannot be settled any more: their delivery tags meant
// something on that channel only, and the broker has put their messages
// back in the queue, to come again on the new one. Their Ack, Nack, Term
// and InProgress return an error matching ErrStaleDelivery (and
// idem.ErrStaleDelivery), a delayed Nack without making its copy, and
// AckBatch passes over them.
//
// # Clusters
//
// Open takes the AMQP URLs of a cluster's nodes, comma-separated: the
// Transport connects to the first that answers and, when its connection
// is lost, dials the next ones in turn, starting after the node it lost.
// Publish fails while the connection is down (a relay publishes again);
// a stream whose channel died subscribes again on the new connection, and
// the broker puts back what the dead channel held.
//
// Consumers' queues are quorum queues by default: RabbitMQ places a member
// on every node of the cluster when it declares one, confirms a publish
// once a majority of the members has the message, and elects a new leader
// among them when the leader's node is lost. A classic queue
// (Config.ClassicQueues) lives on one node, so on a cluster (Open given
// several nodes) Warnings reports each consumer's classic queue with
// ErrNotReplicated. AMQP does not tell a client where a quorum queue's
// members are: a node that joins the cluster after the queue was declared
// holds none until an operator runs rabbitmq-queues grow, and
// rabbitmq-queues quorum_status (or rabbitmqctl list_queues name leader
// members online) shows them; the transport cannot check it.
//
// What a lost node does, measured by TestClusterRabbitMQ (three RabbitMQ
// 3.10.8 nodes on one machine, 8 keys of 40 events each, the node that
// leads the consumer's quorum queue, which the Transport is connected to,
// killed with SIGKILL a third of the way and restarted at two thirds;
// IDEMTEST_CLUSTER_SCALE lengthens it): a new leader within about two
// seconds; publishes that failed with the connection (some tens) sent
// again, which RabbitMQ, not de-duplicating, may store twice; the inbox
// absorbs those copies and the deliveries whose acknowledgement was lost;
// no acknowledged event lost, none applied twice, and every key applied
// in order, whether the consumer de-duplicates by message ID or by key
// and sequence number (consumer.Config.Sequence). Quorum queues fsync
// their log before they confirm, so a power loss of the majority does not
// lose a confirmed message either.
//
// # Server versions
//
// Tested with RabbitMQ 3.10.8. Quorum queues' message TTL and
// at-least-once dead-lettering need 3.10 or later; with
// Config.ClassicQueues any 3.x server will do. RabbitMQ 4.0 gives quorum
// queues a delivery limit of 20 by default, which the limit queue catches
// (see above). RabbitMQ 3.10 refuses a policy's --apply-to quorum_queues,
// which newer versions take: the command above says queues, which every
// version takes, and its pattern names the one queue. Up to 4.2, a quorum queue's
// x-delivery-count counts every return of a message to the queue. RabbitMQ
// 4.3 counts only the returns it takes for failures, among them
// basic.reject with requeue, which Nack uses for that reason; a delivery
// given back by a closed channel or a consumer_timeout may then not count,
// and Attempt is a lower bound.
package idemamqp
