package idemamqp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue returns the name of consumer's queue.
func (t *Transport) Queue(consumer string) string { return t.cfg.QueuePrefix + "." + consumer }

// limitQueue names the queue that holds the messages queue gave up past
// its delivery limit.
func limitQueue(queue string) string { return queue + ".limit" }

// queueArgs returns the arguments of the consumer's queue named queue.
// A quorum queue dead-letters, at least once, to limitQueue(queue)
// through the default exchange: whatever delivery limit applies (the
// configured one, RabbitMQ 4's default, a policy's), a message past it is
// kept there rather than dropped. At-least-once dead-lettering needs
// overflow reject-publish (with drop-head RabbitMQ falls back to at most
// once), so a queue at a length limit set by a policy refuses a new
// message (Publish returns ErrNacked) instead of dropping its oldest.
func (t *Transport) queueArgs(queue string) amqp.Table {
	args := t.legacyQueueArgs()
	if t.cfg.ClassicQueues {
		return args
	}
	args[argDeadLetterExchange] = ""
	args[argDeadLetterRoutingKey] = limitQueue(queue)
	args[argDeadLetterStrategy] = deadLetterAtLeastOnce
	args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	return args
}

// legacyQueueArgs returns the arguments the earlier versions of the
// transport gave a consumer's queue, without a dead-letter target.
func (t *Transport) legacyQueueArgs() amqp.Table {
	if t.cfg.ClassicQueues {
		return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}
	}
	args := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	if t.cfg.DeliveryLimit > 0 {
		args[argDeliveryLimit] = int64(t.cfg.DeliveryLimit)
	}
	return args
}

// limitQueueArgs returns the arguments of a "<queue>.limit" queue. It has
// no dead-letter target of its own: RabbitMQ drops a message
// dead-lettered round a cycle without a rejection in it (back to the
// queue, or to itself), so its delivery limit is set beyond reach
// instead, which overrides RabbitMQ 4's default. Overflow reject-publish
// keeps, should a policy give it a length limit, the messages it cannot
// take in the queue that gives them up, rather than dropping its oldest.
func limitQueueArgs() amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:     amqp.QueueTypeQuorum,
		argDeliveryLimit:      int64(limitQueueDeliveryLimit),
		amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish,
	}
}

// declareQueue declares the consumer's queue on ch and returns the channel
// to go on with: another one when the broker closed ch by refusing the
// declaration; on an error, it has closed the channels. A queue an earlier
// version declared has no dead-letter target, and arguments cannot change
// on an existing queue (RabbitMQ answers PRECONDITION_FAILED and closes
// the channel): such a queue is declared passively instead, checked
// against the arguments that version gave it (so that another queue type
// or delivery limit is still refused), and reported in Warnings. Should
// the queue be deleted between the two declarations, the second creates
// it as that version did, still reported.
func (t *Transport) declareQueue(ctx context.Context, ch *amqp.Channel, queue string) (*amqp.Channel, error) {
	_, err := ch.QueueDeclare(queue, true, false, false, false, t.queueArgs(queue))
	if err == nil {
		return ch, nil
	}
	if !lacksDeadLetterTarget(err) {
		_ = ch.Close()
		return nil, err
	}
	refusal := err
	// The refusal closed the channel, as a failed declaration does.
	_ = ch.Close()
	if ch, err = t.channel(ctx); err != nil {
		return nil, err
	}
	if _, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil); err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, t.legacyQueueArgs())
	}
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("%w; and as declared without one: %w", refusal, err)
	}
	t.warn(ctx, &Warning{Queue: queue, Problem: ErrNoDeadLetterTarget, Fix: limitPolicyCommand(queue)})
	return ch, nil
}

// lacksDeadLetterTarget reports whether err is RabbitMQ's refusal to
// declare a queue with the dead-letter arguments because the existing
// queue has none of them: "PRECONDITION_FAILED - inequivalent arg
// 'x-dead-letter-exchange' for queue ... but current is none".
func lacksDeadLetterTarget(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.HasSuffix(ae.Reason, "but current is none") {
		return false
	}
	for _, arg := range []string{argDeadLetterExchange, argDeadLetterRoutingKey, argDeadLetterStrategy, amqp.QueueOverflowArg} {
		if strings.Contains(ae.Reason, "inequivalent arg '"+arg+"'") {
			return true
		}
	}
	return false
}

// limitPolicyCommand returns the rabbitmqctl command that gives queue,
// declared without a dead-letter target, the one the transport declares.
func limitPolicyCommand(queue string) string {
	def, _ := json.Marshal(map[string]string{
		"dead-letter-exchange":    "",
		"dead-letter-routing-key": limitQueue(queue),
		"dead-letter-strategy":    deadLetterAtLeastOnce,
		"overflow":                amqp.QueueOverflowRejectPublish,
	})
	return "rabbitmqctl set_policy " + shellQuote(limitQueue(queue)) + " " +
		shellQuote("^"+regexp.QuoteMeta(queue)+"$") + " " + shellQuote(string(def)) + " --apply-to queues"
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (t *Transport) noteQueue(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queues[name] = true
}

// DeleteQueues deletes the queues this Transport has declared (consumers'
// queues, their limit queues and their delay queues), with the messages in
// them. It is for tests and for retiring consumers.
func (t *Transport) DeleteQueues(ctx context.Context) error {
	t.mu.Lock()
	names := make([]string, 0, len(t.queues))
	for q := range t.queues {
		names = append(names, q)
	}
	t.mu.Unlock()
	ch, err := t.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range names {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("idemamqp: delete queue %q: %w", q, err)
		}
		t.mu.Lock()
		delete(t.queues, q)
		t.mu.Unlock()
	}
	return nil
}

// delayQueue names the queue that holds queue's copies for delay.
func (t *Transport) delayQueue(queue string, delay time.Duration) string {
	return queue + ".delay." + strconv.FormatInt(delay.Milliseconds(), 10)
}

// delayBucket rounds delay up to whole milliseconds with at most five
// significant bits, so it comes back no sooner, at most 1/16 later, and
// delays share a few dozen queues per consumer instead of one each.
func delayBucket(delay time.Duration) time.Duration {
	ms := uint64((delay + time.Millisecond - 1) / time.Millisecond)
	if ms == 0 {
		ms = 1
	}
	if shift := bits.Len64(ms) - 5; shift > 0 {
		step := uint64(1) << shift
		ms = (ms + step - 1) &^ (step - 1)
	}
	return time.Duration(ms) * time.Millisecond
}
