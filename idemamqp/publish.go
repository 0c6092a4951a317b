package idemamqp

import (
	"context"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

// pubChannel is the channel Publish uses, in confirm mode.
type pubChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
}

// publisher returns the publishing channel, opening it if needed.
// t.pubLock is held.
func (t *Transport) publisher(ctx context.Context) (*pubChannel, error) {
	if t.pub != nil && !t.pub.ch.IsClosed() {
		return t.pub, nil
	}
	t.pub = nil
	ch, err := t.channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("idemamqp: confirm mode: %w", err)
	}
	// The returns buffer holds twice the messages awaiting confirms, and
	// publish drains it after each confirm, so the library, which blocks
	// on a full one, never has to wait.
	t.pub = &pubChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 2*t.cfg.PublishWindow))}
	return t.pub, nil
}

// dropPublisher discards the publishing channel after a failure, so that
// late confirms and returns cannot be taken for the next call's. The
// channel is closed without waiting: one the broker stopped answering
// never sends close-ok, and the wait would hold t.pubLock for good.
// t.pubLock is held.
func (t *Transport) dropPublisher() {
	if t.pub != nil {
		ch := t.pub.ch
		t.pub = nil
		go func() { _ = ch.Close() }()
	}
}

// outgoing is one message ready to publish.
type outgoing struct {
	id         string
	mandatory  bool
	exchange   string
	routingKey string
	pub        amqp.Publishing
}

// Publish implements idem.Publisher: each message goes to the exchange
// with its topic as routing key, persistent, with its ID as
// message_id, on a channel in confirm mode. Publish returns nil once the
// broker has confirmed every message, which for a durable queue means it
// has stored it (for a quorum queue, on a majority of its replicas). The
// messages of one call are pipelined in order on one channel, up to
// Config.PublishWindow of them awaiting their confirms at once; should
// the broker refuse one, later ones of the call may have been stored, so
// a retried call can deliver them out of order (consumers de-duplicate).
//
// Returns an error matching idem.ErrInvalidArgument, having published
// nothing, when a message does not validate or a header cannot travel (see
// the package documentation); ErrUnroutable, with Config.Mandatory, when
// no queue is bound to a message's topic; ErrNacked when the broker did not confirm one;
// idem.ErrClosed after Close.
func (t *Transport) Publish(ctx context.Context, msgs ...idem.Message) error {
	now := t.cfg.Clock.Now()
	out := make([]outgoing, len(msgs))
	for i, m := range msgs {
		p, err := toPublishing(m, now)
		if err != nil {
			return err
		}
		out[i] = outgoing{id: m.ID, mandatory: t.cfg.Mandatory, exchange: t.cfg.Exchange, routingKey: m.Topic, pub: p}
	}
	return t.publish(ctx, out)
}

// publish sends out and waits for its confirms, keeping up to
// Config.PublishWindow of them outstanding.
func (t *Transport) publish(ctx context.Context, out []outgoing) error {
	if len(out) == 0 {
		return nil
	}
	select {
	case t.pubLock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("idemamqp: publish: waiting for the publishing channel: %w", ctx.Err())
	}
	defer func() { <-t.pubLock }()
	pc, err := t.publisher(ctx)
	if err != nil {
		return err
	}
	ids := make(map[string]bool, len(out))
	for _, o := range out {
		ids[o.id] = true
	}
	var unroutable []string
	// takeReturns collects the returns that have arrived. RabbitMQ sends
	// a mandatory message's basic.return before its basic.ack, and the
	// library hands the return over before it resolves the confirm, so
	// once a message is confirmed its return, if any, is here.
	takeReturns := func() error {
		for {
			select {
			case r, ok := <-pc.returns:
				if !ok {
					t.dropPublisher()
					return fmt.Errorf("idemamqp: publish: channel closed: %w", ErrNacked)
				}
				if ids[r.MessageId] {
					unroutable = append(unroutable, fmt.Sprintf("%q to %q", r.MessageId, r.RoutingKey))
				}
			default:
				return nil
			}
		}
	}
	confirms := make([]*amqp.DeferredConfirmation, len(out))
	await := func(i int) error {
		ok, err := confirms[i].WaitContext(ctx)
		confirms[i] = nil
		if err != nil {
			t.dropPublisher()
			return fmt.Errorf("idemamqp: publish %q: waiting for its confirm: %w", out[i].id, err)
		}
		if !ok {
			t.dropPublisher()
			return fmt.Errorf("idemamqp: publish %q: %w", out[i].id, ErrNacked)
		}
		return takeReturns()
	}
	oldest := 0
	for i, o := range out {
		if i-oldest == t.cfg.PublishWindow {
			if err := await(oldest); err != nil {
				return err
			}
			oldest++
		}
		dc, err := pc.ch.PublishWithDeferredConfirmWithContext(ctx, o.exchange, o.routingKey, o.mandatory, false, o.pub)
		if err != nil {
			t.dropPublisher()
			return fmt.Errorf("idemamqp: publish %q: %w", o.id, err)
		}
		confirms[i] = dc
	}
	for ; oldest < len(out); oldest++ {
		if err := await(oldest); err != nil {
			return err
		}
	}
	if len(unroutable) > 0 {
		return fmt.Errorf("idemamqp: publish %s: %w", strings.Join(unroutable, ", "), ErrUnroutable)
	}
	return nil
}

// toPublishing converts m, copying what it keeps.
func toPublishing(m idem.Message, now time.Time) (amqp.Publishing, error) {
	if err := m.Validate(); err != nil {
		return amqp.Publishing{}, err
	}
	if len(m.Topic) > 255 {
		return amqp.Publishing{}, &idem.ArgumentError{Field: "Message.Topic", Reason: "an AMQP routing key must fit in 255 bytes"}
	}
	if len(m.ID) > 255 {
		return amqp.Publishing{}, &idem.ArgumentError{Field: "Message.ID", Reason: "an AMQP message_id must fit in 255 bytes"}
	}
	h := amqp.Table{}
	for k, v := range m.Headers {
		if err := checkHeader(k); err != nil {
			return amqp.Publishing{}, err
		}
		h[k] = v
	}
	if m.Key != "" {
		h[HeaderKey] = m.Key
	}
	at := m.Time
	if at.IsZero() {
		at = now
	}
	h[HeaderTime] = at.UTC().Format(time.RFC3339Nano)
	return amqp.Publishing{
		Headers:      h,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    at,
		Body:         append([]byte(nil), m.Payload...),
	}, nil
}

// reserved reports whether a header belongs to the broker or the
// transport rather than to the message.
func reserved(name string) bool {
	if strings.HasPrefix(name, "x-") {
		return true
	}
	for _, r := range []string{HeaderKey, HeaderTime, HeaderTopic, HeaderAttempts} {
		if strings.EqualFold(name, r) {
			return true
		}
	}
	return false
}

func checkHeader(name string) error {
	field := fmt.Sprintf("Message.Headers[%q]", name)
	switch {
	case name == "" || len(name) > 255:
		return &idem.ArgumentError{Field: field, Reason: "an AMQP header name must be 1 to 255 bytes"}
	case reserved(name):
		return &idem.ArgumentError{Field: field, Reason: `the name is reserved ("x-…", ` + HeaderKey + ", " + HeaderTime + ", " + HeaderTopic + ", " + HeaderAttempts + ")"}
	}
	return nil
}
