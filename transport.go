package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Publisher sends messages to a transport.
type Publisher interface {
	// Publish sends msgs, in order. When it returns nil the transport holds
	// them (durably, where the transport can promise that). On an error some
	// may have been sent: publishing again is safe, because consumers
	// de-duplicate by Message.ID.
	Publish(ctx context.Context, msgs ...Message) error
}

// Subscription describes a durable consumer of one topic.
type Subscription struct {
	// Topic is what to consume.
	Topic string
	// Consumer is the durable name: deliveries not acknowledged by one
	// incarnation of the consumer go to the next.
	Consumer string
	// AckWait is how long a delivery may go without Ack, Nack, Term or
	// InProgress before the transport delivers it again. Zero means the
	// transport's default.
	AckWait time.Duration
	// MaxInFlight bounds unacknowledged deliveries. Zero means the
	// transport's default.
	MaxInFlight int
}

// Validate reports whether s can be subscribed: it names a Topic and a
// Consumer, and its AckWait and MaxInFlight are not negative. It returns
// an *ArgumentError naming the first field that is not. Transports check
// it first, then what their broker adds (names it cannot hold).
func (s Subscription) Validate() error {
	switch {
	case s.Topic == "":
		return &ArgumentError{Field: "Subscription.Topic", Reason: "must not be empty"}
	case s.Consumer == "":
		return &ArgumentError{Field: "Subscription.Consumer", Reason: "must not be empty"}
	case s.AckWait < 0:
		return &ArgumentError{Field: "Subscription.AckWait", Reason: "must not be negative"}
	case s.MaxInFlight < 0:
		return &ArgumentError{Field: "Subscription.MaxInFlight", Reason: "must not be negative"}
	}
	return nil
}

// Subscriber starts durable subscriptions.
type Subscriber interface {
	// Subscribe starts (or resumes) the subscription and returns its stream
	// of deliveries. Close the stream to stop.
	Subscribe(ctx context.Context, sub Subscription) (Stream, error)
}

// Stream yields a subscription's deliveries.
type Stream interface {
	// Next blocks until a delivery is available, ctx is done (ctx.Err()),
	// or the stream is closed (ErrClosed).
	Next(ctx context.Context) (Delivery, error)
	// Close stops the stream. Deliveries not yet settled are delivered
	// again later, to this consumer's next incarnation.
	Close() error
}

// Delivery is one delivery of a message to a consumer. Exactly one of Ack,
// Nack and Term settles it; InProgress may be called any number of times
// before that.
//
// Once a delivery no longer stands for its message (it was settled, or the
// message went back to the transport or on to another holder: an AckWait
// or lease that ended, a partition taken away with a rebalance or a lost
// session, the AMQP channel it came on closed), each of its methods
// returns an error that matches ErrStaleDelivery and changes nothing, as
// far as the transport can tell: each transport's own ErrStaleDelivery
// says what it can. JetStream acknowledges by stream sequence and knows
// of no delivery but the latest, so idemnats tells only a later delivery
// of the message to the same stream: one whose message went to another
// stream of its consumer still answers, and its Ack settles the message.
// InProgress is therefore also how a consumer asks whether a delivery is
// still its own.
type Delivery interface {
	Message() Message
	// Attempt counts deliveries of this message to this consumer, from 1.
	// Transports that keep their own count (JetStream, RabbitMQ quorum
	// queues, the database transports) report it, so it survives a
	// consumer's restart.
	Attempt() int
	// Ack settles the delivery as done: it is not delivered again.
	Ack(ctx context.Context) error
	// Nack settles it for now: it is delivered again after delay. A
	// negative delay is refused with an *ArgumentError
	// (ValidateNackDelay) and changes nothing: the delivery stays
	// unsettled.
	Nack(ctx context.Context, delay time.Duration) error
	// Term settles it for good without processing: it is not delivered
	// again. A consumer terminates what it has dead-lettered.
	Term(ctx context.Context) error
	// InProgress tells the transport the consumer is still working, so the
	// delivery is not given to another consumer after AckWait.
	InProgress(ctx context.Context) error
}

// ValidateNackDelay reports whether delay can be passed to Delivery.Nack:
// it returns an *ArgumentError (ErrInvalidArgument) when delay is negative,
// a caller's mistake (a time subtracted the wrong way round) that no
// transport guesses the meaning of. Every transport checks it first, so
// that they all answer alike.
func ValidateNackDelay(delay time.Duration) error {
	if delay < 0 {
		return &ArgumentError{Field: "delay", Reason: fmt.Sprintf("must not be negative (%v)", delay)}
	}
	return nil
}

// ErrClosed is returned by a closed Stream, Publisher or Subscriber.
var ErrClosed = errors.New("idem: closed")

// StreamStats is what the streams a Subscriber opened for one consumer
// hold in the process's memory, and how their commits of the consumer's
// position fared. A transport that can tell has a method
// StreamStats(consumer string) StreamStats (idemkafka's Transport does);
// idemprom exports it as gauges.
type StreamStats struct {
	// Held counts the messages the streams hold: fetched and not yet
	// handed out, handed out and not settled, or Nacked and waiting for
	// their delay. It stays within Limit.
	Held int
	// HeldBytes counts their keys, payloads and headers.
	HeldBytes int64
	// HeldPeak is the most the streams have held at once, each since it
	// was opened, summed.
	HeldPeak int
	// Delayed counts the messages of Held that wait for their delay.
	Delayed int
	// Limit is the most Held may reach: the streams' MaxInFlight, summed.
	Limit int
	// Uncommitted counts the messages fetched past the position last
	// committed: what a crash would deliver again. A message that stays
	// unsettled (retried in memory, or in a handler that does not return)
	// holds its partition's position, and the count grows behind it.
	Uncommitted int64
	// OldestHeld is when the message held longest was fetched; zero when
	// none is held.
	OldestHeld time.Time
	// CommitFailures counts the commits of a partition's position that
	// failed since the Subscriber was made. Each is tried again by the
	// next commit; until one succeeds, a restart delivers again what was
	// settled since the last.
	CommitFailures int64
}
