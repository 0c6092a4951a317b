package outbox

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// Pass describes one pass of a Relay (one Flush) to an Observer.
type Pass struct {
	// Relay is the relay's name.
	Relay string
	// Start is when the pass began, and Duration how long it took.
	Start    time.Time
	Duration time.Duration
	// Moved reports a pass made by the Publisher as one MoveOutbox
	// (idem.OutboxMover): the relay did not see the messages.
	Moved bool
	// Messages are the messages the pass published, in order (nil for a
	// move). Their Headers carry what the writer put there, such as a W3C
	// traceparent. They are the relay's: read them, never change them.
	Messages []idem.Message
	// Oldest is when the oldest of Messages was added to the outbox; zero
	// for a move.
	Oldest time.Time
	// Sent is how many entries the pass marked sent (or moved).
	Sent int
	// Err is why the pass failed, if it did.
	Err error
}

// Observer sees the relay's passes, for tracing and metrics (packages
// idemotel and idemprom implement it). A pass that found nothing to relay
// is not reported, so an idle relay costs nothing. Config.Observer nil
// calls nothing.
type Observer interface {
	// Pass is called after each pass that relayed something or failed.
	Pass(ctx context.Context, p Pass)
}

// Observers returns an Observer that calls each of obs in turn (nil ones
// skipped); with none left it returns nil.
func Observers(obs ...Observer) Observer {
	var t observers
	for _, o := range obs {
		if o != nil {
			t = append(t, o)
		}
	}
	switch len(t) {
	case 0:
		return nil
	case 1:
		return t[0]
	}
	return t
}

type observers []Observer

func (t observers) Pass(ctx context.Context, p Pass) {
	for _, o := range t {
		o.Pass(ctx, p)
	}
}

// observe reports a pass begun at start, when it did something.
func (r *Relay) observe(ctx context.Context, start time.Time, p Pass) {
	if r.cfg.Observer == nil || (p.Sent == 0 && p.Err == nil && len(p.Messages) == 0) {
		return
	}
	p.Relay, p.Start, p.Duration = r.cfg.Name, start, time.Since(start)
	r.cfg.Observer.Pass(ctx, p)
}
