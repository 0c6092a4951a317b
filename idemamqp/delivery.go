package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

// deliveryState is where a delivery is in its settlement.
type deliveryState int

const (
	open deliveryState = iota
	// settling: an Ack, Nack, Term or AckBatch is under way.
	settling
	settled
)

type delivery struct {
	s *stream
	// gen is the channel the delivery came on, which alone can settle it.
	gen     *channelGen
	d       amqp.Delivery
	m       idem.Message
	attempt int

	mu    sync.Mutex
	state deliveryState
}

// Message implements idem.Delivery.
func (d *delivery) Message() idem.Message {
	m := d.m
	m.Headers = maps.Clone(m.Headers)
	m.Payload = append([]byte(nil), m.Payload...)
	return m
}

// Attempt implements idem.Delivery: on a quorum queue, 1 + the queue's
// x-delivery-count + the deliveries before a delayed copy was made + the
// deliveries the queue's limit allowed, for a message it gave up to
// "<queue>.limit".
func (d *delivery) Attempt() int { return d.attempt }

// Ack implements idem.Delivery with basic.ack.
func (d *delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, "ack", func() error { return d.d.Ack(false) })
}

// Term implements idem.Delivery with basic.ack: the message leaves the
// queue for good. Not basic.reject without requeue: a quorum queue
// dead-letters a rejected message to "<queue>.limit", which would deliver
// it again, and the consumer that gives a message up has put it in idem's
// dead letters already.
func (d *delivery) Term(ctx context.Context) error {
	return d.settle(ctx, "term", func() error { return d.d.Ack(false) })
}

// Nack implements idem.Delivery. With no delay, basic.reject with
// requeue=true puts the message back at once. With a delay, RabbitMQ has
// nothing per message: a copy goes to a delay queue whose TTL is the
// delay rounded up, from which the broker dead-letters it back into the
// consumer's queue, and then the original is acknowledged. See the package
// documentation for the guarantees.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := idem.ValidateNackDelay(delay); err != nil {
		return err
	}
	if delay <= 0 {
		// basic.reject rather than basic.nack: from RabbitMQ 4.3 only
		// the former counts in x-delivery-count.
		return d.settle(ctx, "nack", func() error { return d.d.Reject(true) })
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.claim("nack"); err != nil {
		return err
	}
	copyCtx, cancel := context.WithTimeout(ctx, delayCopyTimeout)
	err := bounded(copyCtx, func() error { return d.delayCopy(copyCtx, delay) })
	cancel()
	if err == nil {
		err = d.gen.settle(d.d.DeliveryTag, func() error { return d.d.Ack(false) })
	} else {
		// The copy may not be in its queue: the original goes back at
		// once, without its delay, rather than stay held by this
		// channel, which RabbitMQ would deliver again only once the
		// channel closed. Should the copy be there after all, the
		// message comes twice, and the inbox absorbs it.
		copyErr := err
		if err = d.gen.settle(d.d.DeliveryTag, func() error { return d.d.Reject(true) }); err == nil {
			d.s.t.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "delayed nack: the copy failed; the message is requeued at once",
				slog.String("message_id", d.m.ID), slog.Duration("delay", delay), slog.String("error", copyErr.Error()))
		}
		if errors.Is(copyErr, context.DeadlineExceeded) && ctx.Err() == nil {
			// Not the caller's deadline but delayCopyTimeout's: the broker
			// took the copy and never confirmed it, seen on a RabbitMQ
			// restarted again and again, whose channel then answered
			// nothing more, not even its close.
			d.s.t.abandon(ctx, copyErr)
		}
	}
	d.release(err == nil)
	if err != nil {
		return d.settleError("nack", err)
	}
	return nil
}

// InProgress implements idem.Delivery: RabbitMQ has no ack deadline to
// extend, so it only says whether d is still this consumer's own. Its
// consumer_timeout (30 minutes by default) closes a channel that holds a
// delivery longer, and then InProgress answers ErrStaleDelivery.
func (d *delivery) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == settled {
		return fmt.Errorf("idemamqp: in progress: message %q: %w", d.m.ID, ErrStaleDelivery)
	}
	if d.gen.gone() {
		return fmt.Errorf("idemamqp: in progress: message %q: %w", d.m.ID, errChannelGone)
	}
	return nil
}

// claim starts settling d, or returns ErrStaleDelivery when d is settled
// or being settled, or its channel is gone.
func (d *delivery) claim(op string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != open {
		return fmt.Errorf("idemamqp: %s: message %q: %w", op, d.m.ID, ErrStaleDelivery)
	}
	if d.gen.gone() {
		return fmt.Errorf("idemamqp: %s: message %q: %w", op, d.m.ID, errChannelGone)
	}
	d.state = settling
	return nil
}

// errChannelGone is what a delivery of a channel that closed answers: its
// delivery tag meant something on that channel only, and the broker has
// put the message back in the queue, for this consumer's next channel or
// another consumer.
var errChannelGone = fmt.Errorf("its channel closed, and the broker delivers the message again: %w", ErrStaleDelivery)

// settleError returns err, the failure of a settlement of d, made stale
// when d's channel closed meanwhile (the library answers amqp.ErrClosed
// then): the broker has requeued the message.
func (d *delivery) settleError(op string, err error) error {
	if errors.Is(err, amqp.ErrClosed) || d.gen.gone() {
		return fmt.Errorf("idemamqp: %s: message %q: %w (%w)", op, d.m.ID, errChannelGone, err)
	}
	return fmt.Errorf("idemamqp: %s: message %q: %w", op, d.m.ID, err)
}

// release ends what claim started: d is settled, or open again after a
// failure.
func (d *delivery) release(done bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if done {
		d.state = settled
	} else {
		d.state = open
	}
}

// settle settles d with fn, one frame on its channel.
func (d *delivery) settle(ctx context.Context, op string, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := d.claim(op); err != nil {
		return err
	}
	err := d.gen.settle(d.d.DeliveryTag, fn)
	d.release(err == nil)
	if err != nil {
		return d.settleError(op, err)
	}
	return nil
}

// delayCopyTimeout bounds a delayed Nack's copy (the delay queue's
// declaration, the publish and its confirm), whatever the caller's
// context: a broker that never answers (seen on a RabbitMQ restarted again
// and again) must not hold the delivery, and the publishing channel every
// other Nack waits for, forever.
const delayCopyTimeout = 5 * time.Second

// bounded runs fn and returns its error, or ctx's once ctx is done,
// leaving fn to end by itself: the library's channel calls (open, declare,
// close) take no context, and one the broker never answers returns only
// once the connection is closed.
func bounded(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// delayCopy publishes a copy of the message to the delay queue of the
// consumer for delay, and waits for its confirm.
func (d *delivery) delayCopy(ctx context.Context, delay time.Duration) error {
	t := d.s.t
	ms := delayBucket(delay)
	q := t.delayQueue(d.s.queue, ms)
	if err := t.declareDelayQueue(ctx, d.s.queue, q, ms); err != nil {
		return err
	}
	h := amqp.Table{}
	for k, v := range d.d.Headers {
		if !strings.HasPrefix(k, "x-") {
			h[k] = v
		}
	}
	h[HeaderTopic] = d.m.Topic
	h[HeaderAttempts] = strconv.Itoa(d.attempt)
	if _, ok := h[HeaderTime]; !ok {
		h[HeaderTime] = d.m.Time.UTC().Format(time.RFC3339Nano)
	}
	err := t.publish(ctx, []outgoing{{
		id:         d.m.ID,
		mandatory:  true,
		exchange:   "",
		routingKey: q,
		pub: amqp.Publishing{
			Headers:      h,
			DeliveryMode: amqp.Persistent,
			MessageId:    d.d.MessageId,
			Timestamp:    d.d.Timestamp,
			ContentType:  d.d.ContentType,
			Body:         d.d.Body,
		},
	}})
	if err != nil {
		// The queue may be gone (lost with a broker crash, or expired):
		// the next copy declares it again.
		t.forgetDelayQueue(q)
	}
	return err
}

// redeclareEvery is how often a delay queue in use is declared again: a
// queue's x-expires counts from its last declaration (publishing is no
// use), and a delay queue's is ten minutes and more.
const redeclareEvery = time.Minute

// declareDelayQueue declares q, queue's delay queue for ms, unless this
// Transport did in the last redeclareEvery.
func (t *Transport) declareDelayQueue(ctx context.Context, queue, q string, ms time.Duration) error {
	now := t.cfg.Clock.Now()
	t.mu.Lock()
	at, ok := t.delayQueues[q]
	t.mu.Unlock()
	if ok && now.Sub(at) < redeclareEvery {
		return nil
	}
	ch, err := t.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	args := amqp.Table{
		amqp.QueueMessageTTLArg:     ms.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": queue,
		amqp.QueueTTLArg:            (2*ms + 10*time.Minute).Milliseconds(),
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-dead-letter-strategy":    "at-least-once",
		amqp.QueueOverflowArg:       amqp.QueueOverflowRejectPublish,
	}
	if t.cfg.ClassicQueues {
		args[amqp.QueueTypeArg] = amqp.QueueTypeClassic
		delete(args, "x-dead-letter-strategy")
		delete(args, amqp.QueueOverflowArg)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare delay queue %q: %w", q, err)
	}
	t.noteQueue(q)
	t.mu.Lock()
	t.delayQueues[q] = now
	t.mu.Unlock()
	return nil
}

// forgetDelayQueue makes the next copy to q declare it.
func (t *Transport) forgetDelayQueue(q string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.delayQueues, q)
}
