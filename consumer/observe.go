package consumer

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// Outcome names how the handling of one delivery ended, as an Observer
// sees it. All but OutcomeInterrupted are counted in Stats.
type Outcome string

// Outcomes.
const (
	OutcomeProcessed    Outcome = "processed"     // the handler succeeded and committed
	OutcomeDuplicate    Outcome = "duplicate"     // the inbox had processed it: acknowledged unrun
	OutcomeRetried      Outcome = "retried"       // the attempt failed; another is scheduled
	OutcomeDeadLettered Outcome = "dead_lettered" // moved to the dead letters
	OutcomeParked       Outcome = "parked"        // parked behind a dead letter of its key
	// OutcomeStale: the delivery was no longer the consumer's own (its
	// AckWait or lease ended, its partition was taken away): the message
	// went to another holder, so it was let go, unsettled, neither retried
	// here nor dead-lettered nor parked; or, found so by the heartbeat,
	// it was let go unhandled for a later delivery of its message that
	// the consumer holds.
	OutcomeStale Outcome = "stale"
	// OutcomeInterrupted: the handling ended with none of the above, because
	// Run is stopping or the message went back in line behind its key (a
	// batch-mate of its key failed, or its key was let go meanwhile); it is
	// handled again.
	OutcomeInterrupted Outcome = "interrupted"
)

// Outcomes lists every Outcome, in a stable order.
var Outcomes = []Outcome{
	OutcomeProcessed, OutcomeDuplicate, OutcomeRetried, OutcomeDeadLettered, OutcomeParked, OutcomeStale, OutcomeInterrupted,
}

// Event describes the handling of one delivery to an Observer.
type Event struct {
	// Consumer and Topic are the consumer's.
	Consumer string
	Topic    string
	// Message is the delivered message. Its Headers carry what the
	// producer put there, such as a W3C traceparent.
	Message idem.Message
	// DedupKey is what the message is de-duplicated by; empty when it could
	// not be derived.
	DedupKey string
	// Attempt is the number of the attempt, from 1.
	Attempt int
	// Batch is how many messages were handled with this one, itself
	// included, in the inbox transaction that decided its outcome; 1 when
	// it was handled alone, 0 when no transaction decided it.
	Batch int

	// Set at End.

	// Outcome is how the handling ended.
	Outcome Outcome
	// Duration is the time from Begin to the outcome.
	Duration time.Duration
	// Lag is, for OutcomeProcessed, the time from Message.Time (when it
	// was published) to its commit, by Config.Clock; 0 when the message
	// has no Time.
	Lag time.Duration
	// Err is the failure, for OutcomeRetried and OutcomeDeadLettered.
	Err error
}

// Observer sees the handling of every delivery, for tracing and latency
// histograms (packages idemotel and idemprom implement it). Begin and End
// run on the consumer's workers, so they must be quick, and safe for
// concurrent use. Config.Observer nil calls nothing.
type Observer interface {
	// Begin is called when a worker takes a delivery up, and returns the
	// context of its handling: a Handler's context is derived from it, and
	// so is a BatchHandler's when the batch holds this message alone. An
	// observer with nothing to carry returns ctx.
	Begin(ctx context.Context, e Event) context.Context
	// End is called once, with the context Begin returned, when the
	// handling has an Outcome.
	End(ctx context.Context, e Event)
}

// Observers returns an Observer that calls each of obs in turn (nil ones
// skipped), passing the context each Begin returns to the next. With no
// observer left it returns nil.
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

func (t observers) Begin(ctx context.Context, e Event) context.Context {
	for _, o := range t {
		ctx = o.Begin(ctx, e)
	}
	return ctx
}

func (t observers) End(ctx context.Context, e Event) {
	for _, o := range t {
		o.End(ctx, e)
	}
}

// observation is an entry's handling in progress, as Begin left it.
type observation struct {
	ctx   context.Context // nil when none is in progress
	e     Event
	start time.Time
}

// begin starts observing e's handling, unless it is observed already, and
// returns the context to handle it with.
func (r *runner) begin(e *entry) context.Context {
	obs := r.cfg.Observer
	if obs == nil {
		return r.ctx
	}
	if e.obs.ctx != nil {
		return e.obs.ctx
	}
	ev := Event{Consumer: r.cfg.Name, Topic: r.cfg.Topic, Message: e.msg, DedupKey: e.dedup, Attempt: max(r.delivered(e), e.last+1, 1)}
	e.obs = observation{ctx: obs.Begin(r.ctx, ev), e: ev, start: r.cfg.Clock.Now()}
	return e.obs.ctx
}

// observe ends the observation of e's handling with outcome. It must run
// before e is handed on (settled, made ready, or left to a timer), since
// another worker may take it up at once.
func (r *runner) observe(e *entry, outcome Outcome, batch int, err error) {
	obs := r.cfg.Observer
	if obs == nil || e.obs.ctx == nil {
		return
	}
	ev := e.obs.e
	now := r.cfg.Clock.Now()
	ev.Outcome, ev.Duration, ev.Batch, ev.Err = outcome, now.Sub(e.obs.start), batch, err
	if outcome == OutcomeProcessed && !e.msg.Time.IsZero() {
		ev.Lag = max(now.Sub(e.msg.Time), 0)
	}
	ctx := e.obs.ctx
	e.obs = observation{}
	obs.End(ctx, ev)
}

// interrupted ends the observation of each of es without an outcome.
func (r *runner) interrupted(es []*entry) {
	if r.cfg.Observer == nil {
		return
	}
	for _, e := range es {
		r.observe(e, OutcomeInterrupted, 0, nil)
	}
}

// split is without, ending the observation of the entries it drops (those
// behind one taken out), which another worker may take up once their
// lane's head has settled; all but pending, a failure whose handling waits
// for the batch to settle.
func (r *runner) split(batch []*entry, pending *entry, out func(*entry) bool) (keep, taken []*entry) {
	keep, taken = r.without(batch, out)
	if r.cfg.Observer == nil {
		return keep, taken
	}
	in := make(map[*entry]bool, len(keep)+len(taken))
	for _, e := range keep {
		in[e] = true
	}
	for _, e := range taken {
		in[e] = true
	}
	for _, e := range batch {
		if !in[e] && e != pending {
			r.observe(e, OutcomeInterrupted, 0, nil)
		}
	}
	return keep, taken
}
