package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Message is what a Publisher sends and a Subscriber delivers.
type Message struct {
	// ID identifies the message. Transports pass it as the broker's own
	// message ID (JetStream Nats-Msg-Id, AMQP message_id), and consumers
	// de-duplicate by it unless told to use another key.
	ID string
	// Topic is where the message goes: a subject, a routing key, a queue.
	Topic string
	// Key orders messages: those with the same key are applied one at a
	// time, in order. Empty means no ordering constraint.
	Key string
	// Headers carry metadata beside the payload.
	Headers map[string]string
	// Payload is the message body, as bytes.
	Payload []byte
	// Time is when the message was first published.
	Time time.Time
}

// Validate reports whether m can be published.
func (m Message) Validate() error {
	switch {
	case m.ID == "":
		return &ArgumentError{Field: "Message.ID", Reason: "must not be empty"}
	case m.Topic == "":
		return &ArgumentError{Field: "Message.Topic", Reason: "must not be empty"}
	}
	return nil
}

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
type Delivery interface {
	Message() Message
	// Attempt counts deliveries of this message to this consumer, from 1.
	// Transports that keep their own count (JetStream, RabbitMQ quorum
	// queues, the database transports) report it, so it survives a
	// consumer's restart.
	Attempt() int
	// Ack settles the delivery as done: it is not delivered again.
	Ack(ctx context.Context) error
	// Nack settles it for now: it is delivered again after delay.
	Nack(ctx context.Context, delay time.Duration) error
	// Term settles it for good without processing: it is not delivered
	// again. A consumer terminates what it has dead-lettered.
	Term(ctx context.Context) error
	// InProgress tells the transport the consumer is still working, so the
	// delivery is not given to another consumer after AckWait.
	InProgress(ctx context.Context) error
}

// ErrClosed is returned by a closed Stream, Publisher or Subscriber.
var ErrClosed = errors.New("idem: closed")

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

// OutboxEntry is a message waiting in an outbox.
type OutboxEntry struct {
	// Seq orders entries: the order they were added.
	Seq     int64
	Message Message
	// CreatedAt is when the entry was added.
	CreatedAt time.Time
}

// Outbox keeps messages written in the same transaction as the effect they
// announce, until a relay has published them.
type Outbox interface {
	// Add writes msgs in the transaction carried by ctx (the caller's own,
	// so the messages commit with the effect), or in a transaction of its
	// own when ctx carries none.
	Add(ctx context.Context, msgs ...Message) error
	// Claim leases up to limit unsent entries to relay, oldest first,
	// skipping those another relay holds under a live lease. The lease
	// keeps several relays from publishing one entry twice in normal
	// operation; a relay that crashes after publishing and before MarkSent
	// causes a duplicate, which consumers absorb.
	Claim(ctx context.Context, relay string, limit int, lease time.Duration) ([]OutboxEntry, error)
	// MarkSent records that entries were published.
	MarkSent(ctx context.Context, seqs ...int64) error
}

// ErrorClass says what kind of failure an attempt was.
type ErrorClass string

// Error classes.
const (
	// ClassTransient failures may succeed on retry: timeouts, a dependency
	// that is down. Any error not marked otherwise.
	ClassTransient ErrorClass = "transient"
	// ClassPermanent failures will fail again however often they are
	// retried: a malformed message, data it refers to that is gone.
	ClassPermanent ErrorClass = "permanent"
)

// Classify returns err's class: permanent when marked with Permanent,
// transient otherwise.
func Classify(err error) ErrorClass {
	if IsPermanent(err) {
		return ClassPermanent
	}
	return ClassTransient
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: retrying cannot help, so the message
// goes to the dead letters at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.err, e.delay)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err as transient with its own delay, such as a rate
// limit's: the next attempt waits d instead of the policy's backoff.
// RetryAfter(nil, d) is nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, delay: d}
}

// RetryDelay returns the delay err carries from RetryAfter, if any.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}
