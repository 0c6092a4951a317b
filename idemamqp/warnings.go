package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// ErrNoDeadLetterTarget is the Problem of a Warning about a quorum queue
// declared without a dead-letter target, by an earlier version of the
// transport: RabbitMQ drops a message past its delivery limit (20 by
// default from RabbitMQ 4.0), where the transport's own queues keep it.
var ErrNoDeadLetterTarget = errors.New("idemamqp: the queue has no dead-letter target: RabbitMQ drops a message past its delivery limit (20 by default from RabbitMQ 4.0)")

// ErrNotReplicated is the Problem of a Warning about a classic queue on a
// cluster (Open given several nodes): a classic queue lives on one node,
// and its messages are out of reach while that node is down, and lost with
// its disk. A quorum queue (the default) keeps each message on a majority
// of its members before the publish is confirmed, and goes on when one
// is lost.
var ErrNotReplicated = errors.New("idemamqp: a classic queue lives on one node of the cluster: its messages are lost with that node's disk, and out of reach while it is down")

// A Warning is a setting found on the broker that can drop a message the
// consumer has not settled. The transport goes on working; the setting
// wants an operator.
type Warning struct {
	// Queue is the queue the setting is on.
	Queue string
	// Problem says what can happen; errors.Is matches it against the
	// package's sentinels (ErrNoDeadLetterTarget).
	Problem error
	// Fix is a command that mends it.
	Fix string
}

func (w *Warning) Error() string {
	return fmt.Sprintf("idemamqp: queue %q: %s; to fix it: %s", w.Queue, strings.TrimPrefix(w.Problem.Error(), "idemamqp: "), w.Fix)
}

func (w *Warning) Unwrap() error { return w.Problem }

// warn records w, once per queue and problem, and logs it.
func (t *Transport) warn(ctx context.Context, w *Warning) {
	t.mu.Lock()
	for _, seen := range t.warnings {
		if seen.Queue == w.Queue && seen.Problem == w.Problem {
			t.mu.Unlock()
			return
		}
	}
	t.warnings = append(t.warnings, w)
	t.mu.Unlock()
	t.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "RabbitMQ queue can drop messages",
		slog.String("queue", w.Queue), slog.String("problem", w.Problem.Error()), slog.String("fix", w.Fix))
}

// Warnings returns the settings found on the broker, as the Transport
// declared its queues, that can drop a message no consumer has settled,
// in the order found, each once: a consumer's quorum queue that an
// earlier version declared without a dead-letter target
// (ErrNoDeadLetterTarget), and a consumer's classic queue
// (Config.ClassicQueues) when Open was given several nodes of a cluster
// (ErrNotReplicated). Subscribe finds them, so call it after the
// subscriptions are made; Config.Logger receives each as it is found.
//
// AMQP does not tell a client which nodes hold a quorum queue's members:
// RabbitMQ places one on every node of the cluster when the queue is
// declared, but a node that joins later gets none until an operator runs
// rabbitmq-queues grow, and rabbitmq-queues quorum_status shows them. See
// the package documentation.
func (t *Transport) Warnings() []*Warning {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Warning, len(t.warnings))
	for i, w := range t.warnings {
		c := *w
		out[i] = &c
	}
	return out
}
