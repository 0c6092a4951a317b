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
// queue's messages.
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
//   - At-least-once delivery. A delivery is settled with basic.ack (Ack)
//     or basic.reject without requeue (Term: the queue drops the message,
//     or dead-letters it if a policy says where). A delivery left unsettled
//     when its channel closes, or its connection drops, goes back to the
//     queue at once.
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
//     InProgress does nothing. Only consumer_timeout (30 minutes by
//     default, a broker setting) closes a channel that holds a delivery
//     longer, which puts the message back.
//   - A per-message delay. See below.
//
// From idem, above the transport: de-duplication (the inbox), the decision
// that a message is dead (the consumer package; DeliveryLimit is only a
// broker backstop, unset by default — mind that RabbitMQ 4.0 and later
// default it to 20), per-key order across retries, and the retry delays.
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
//   - With quorum queues the delay queue is a quorum queue with
//     at-least-once dead-lettering (RabbitMQ 3.10 or later), so the copy
//     survives a broker restart and its way back. With classic queues the
//     delay queue is classic and dead-lettering is at most once: a broker
//     crash at that moment can lose the copy.
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
// the dead channel cannot be settled any more (their methods return an
// error, and AckBatch passes over them); the broker has put them back in
// the queue.
//
// # Server versions
//
// Tested with RabbitMQ 3.10.8. Quorum queues' message TTL and
// at-least-once dead-lettering need 3.10 or later; with
// Config.ClassicQueues any 3.x server will do. Up to 4.2, a quorum queue's
// x-delivery-count counts every return of a message to the queue. RabbitMQ
// 4.3 counts only the returns it takes for failures, among them
// basic.reject with requeue, which Nack uses for that reason; a delivery
// given back by a closed channel or a consumer_timeout may then not count,
// and Attempt is a lower bound.
package idemamqp
