package idemamqp

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	"github.com/idem-go/idem"
)

// Header names the transport reserves. Names beginning with "x-" belong
// to RabbitMQ (x-delivery-count, x-death) and are reserved too.
const (
	// HeaderKey carries Message.Key.
	HeaderKey = "Idem-Key"
	// HeaderTime carries Message.Time in RFC 3339 with nanoseconds; the
	// AMQP timestamp property holds only seconds.
	HeaderTime = "Idem-Time"
	// HeaderTopic carries the topic of a delayed copy, whose routing key
	// became its queue's name on the way back.
	HeaderTopic = "Idem-Topic"
	// HeaderAttempts carries, on a delayed copy, how many deliveries the
	// message had before the copy was made.
	HeaderAttempts = "Idem-Attempts"
	// headerDeliveryCount is the quorum queue's count of earlier
	// deliveries of a message.
	headerDeliveryCount = "x-delivery-count"
	// headerDeath is RabbitMQ's record of a message's dead-letterings,
	// most recent first, one entry per queue and reason.
	headerDeath = "x-death"
)

// Queue arguments and the values the transport gives them.
const (
	argDeliveryLimit         = "x-delivery-limit"
	argDeadLetterExchange    = "x-dead-letter-exchange"
	argDeadLetterRoutingKey  = "x-dead-letter-routing-key"
	argDeadLetterStrategy    = "x-dead-letter-strategy"
	deadLetterAtLeastOnce    = "at-least-once"
	deathReasonDeliveryLimit = "delivery_limit"
	// brokerDeliveryLimit is the delivery limit RabbitMQ 4.0 and later give
	// a quorum queue that sets none.
	brokerDeliveryLimit = 20
	// limitQueueDeliveryLimit is the delivery limit of "<queue>.limit",
	// beyond reach, so that RabbitMQ 4's default does not apply to it: it
	// has nowhere to send a message further (see limitQueueArgs).
	limitQueueDeliveryLimit = math.MaxInt32
)

var (
	// ErrUnroutable is returned by Publish when the exchange routed a
	// message to no queue: no consumer has subscribed to its topic yet,
	// and RabbitMQ would have dropped it.
	ErrUnroutable = errors.New("idemamqp: unroutable: no queue is bound to the topic")
	// ErrNacked is returned by Publish when the broker refused a message
	// (a publisher-confirm nack), or the channel closed before it
	// answered: the message may or may not be stored.
	ErrNacked = errors.New("idemamqp: the broker did not confirm the message")
	// ErrStaleDelivery is returned by a Delivery's methods once it has
	// been settled, or once the AMQP channel it came on has closed (the
	// channel or its connection died, the broker closed it, the stream
	// subscribed anew): its delivery tag meant something on that channel
	// only, and the broker has put the message back in the queue. It
	// matches idem.ErrStaleDelivery.
	ErrStaleDelivery = fmt.Errorf("idemamqp: delivery no longer this consumer's to settle (%w)", idem.ErrStaleDelivery)
)

// Config configures a Transport. The zero value is ready to use.
type Config struct {
	// Exchange is the durable topic exchange messages are published to,
	// with the topic as routing key. Defaults to "idem".
	Exchange string
	// QueuePrefix names a consumer's queue: "<QueuePrefix>.<consumer>".
	// Defaults to "idem".
	QueuePrefix string
	// ClassicQueues makes consumers' queues classic queues instead of
	// quorum queues. Classic queues do not count deliveries, so Attempt
	// is then only a lower bound, and have no delivery limit, so they
	// have no limit queue either. Defaults to false: quorum queues.
	ClassicQueues bool
	// DeliveryLimit is the x-delivery-limit of consumers' quorum queues:
	// the returns to the queue a message may have before RabbitMQ gives it
	// up and dead-letters it to "<queue>.limit", from which the
	// subscription delivers it, counted as exhausted (see the package
	// documentation). Classic queues have no delivery limit. Defaults to
	// 0: not set, which is unlimited on RabbitMQ 3.x and 20 on RabbitMQ
	// 4.0 and later (or what a policy says).
	DeliveryLimit int
	// MaxInFlight is the prefetch (basic.qos) of subscriptions that leave
	// Subscription.MaxInFlight zero: room for a batch being handled, the
	// next one waiting in the client and more on the way. A quorum queue
	// counts a delivery in x-delivery-count even when it only reached the
	// client's buffer before its stream closed, so a larger prefetch
	// raises more counts at each restart. Defaults to 300, three of the
	// consumer package's batches of 100.
	MaxInFlight int
	// PublishWindow bounds the messages of one Publish call sent and
	// awaiting their publisher confirms: Publish sends that many ahead
	// before it waits for the oldest confirm. Defaults to 256.
	PublishWindow int
	// Mandatory publishes with the mandatory flag, so that Publish returns
	// ErrUnroutable for a message no queue is bound to, instead of
	// RabbitMQ dropping it. A relay then holds such a message until a
	// consumer has subscribed to its topic, and, since an outbox relays
	// in order, the messages behind it too. Defaults to false: dropped, as
	// AMQP specifies.
	Mandatory bool
	// Clock dates messages published without a Time. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
	// Logger receives the Warnings as they are found, at level Warn.
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Exchange == "" {
		cfg.Exchange = "idem"
	}
	if cfg.QueuePrefix == "" {
		cfg.QueuePrefix = "idem"
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 300
	}
	if cfg.PublishWindow == 0 {
		cfg.PublishWindow = 256
	}
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case strings.HasPrefix(cfg.Exchange, "amq."):
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config.Exchange", Reason: `must not begin with "amq."`}
	case strings.HasPrefix(cfg.QueuePrefix, "amq."):
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config.QueuePrefix", Reason: `must not begin with "amq."`}
	case len(cfg.Exchange) > 255 || len(cfg.QueuePrefix) > 200:
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config", Reason: "names must fit in 255 bytes"}
	case cfg.DeliveryLimit < 0, cfg.MaxInFlight < 0, cfg.PublishWindow < 0:
		return cfg, &idem.ArgumentError{Field: "idemamqp.Config", Reason: "counts must not be negative"}
	}
	return cfg, nil
}
