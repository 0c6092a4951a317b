package keyed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-go/idem"
)

// Outcome names what the engine did with one request.
type Outcome string

// Outcomes, as counted by Engine.Counts.
const (
	OutcomeExecuted   Outcome = "executed"    // ran and its answer was kept
	OutcomeReplayed   Outcome = "replayed"    // a duplicate got the kept answer
	OutcomeConflict   Outcome = "conflict"    // still in flight when the duplicate's wait ended (409, Aborted)
	OutcomeMismatch   Outcome = "mismatch"    // the key was used with another request (422, FailedPrecondition)
	OutcomeReleased   Outcome = "released"    // ran and failed transiently; key released
	OutcomeStoreError Outcome = "store_error" // the store failed; refused, or an answer not kept
	OutcomeLeaseLost  Outcome = "lease_lost"  // the completion was refused (fencing)
	OutcomeRejected   Outcome = "rejected"    // refused by the face before the key was claimed: missing or malformed key, body too large
	OutcomeAborted    Outcome = "aborted"     // the handler ended like a crash (Ran.Crashed) outside a shared transaction; key left to its lease
	OutcomeUnfinished Outcome = "unfinished"  // failed after a recovery point; key left in flight for a retry or a Completer
)

// Outcomes lists every Outcome, in a stable order.
var Outcomes = []Outcome{
	OutcomeExecuted, OutcomeReplayed, OutcomeConflict, OutcomeMismatch,
	OutcomeReleased, OutcomeStoreError, OutcomeLeaseLost, OutcomeRejected, OutcomeAborted,
	OutcomeUnfinished,
}

// Phase is a step of a request, as an Observer sees it.
type Phase uint8

// Phases, in the order a first execution goes through them. A request
// always has PhaseRequest around the others; a replay has PhaseReplay
// where an execution has PhaseHandler and PhaseComplete.
const (
	// PhaseRequest is the whole request, from the face's first look at it
	// to its answer. Its End carries the Outcome.
	PhaseRequest Phase = iota
	// PhaseClaim is claiming the key, waiting for an execution of it in
	// flight included, up to the claim's result (Event.Claim).
	PhaseClaim
	// PhaseHandler is the handler's run. The handler's context is derived
	// from the context Observer.Begin returns for it.
	PhaseHandler
	// PhaseComplete is keeping the answer (Complete, or the commit of the
	// store's transaction) or releasing the key after a transient failure.
	PhaseComplete
	// PhaseReplay is answering a duplicate with the kept answer: reading
	// it, when the key was seen completed lately, and writing it.
	PhaseReplay
)

var phaseNames = [...]string{"request", "claim", "handler", "complete", "replay"}

// String returns the phase's name: request, claim, handler, complete or
// replay.
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// StoreOp names one round trip to the idem.Store, as Observer.Store sees it.
type StoreOp string

// Store operations.
const (
	StoreClaim    StoreOp = "claim"    // Store.Claim, or ClaimTx up to the handler's start
	StoreComplete StoreOp = "complete" // Store.Complete, or CompleteTx and ClaimTx after the handler: the commit
	StoreRelease  StoreOp = "release"  // Store.Release
	StoreGet      StoreOp = "get"      // Store.Get
	StoreReplay   StoreOp = "replay"   // idem.Replayer's Replay
)

// Claim results, as Event.Claim reports them at the end of PhaseClaim.
const (
	ClaimAcquired  = "acquired"  // the key is this request's: the handler runs
	ClaimCompleted = "completed" // the key's answer is kept: it is replayed
	ClaimMismatch  = "mismatch"  // the key was used with another request
	ClaimInFlight  = "in_flight" // still in flight when the wait ended
	ClaimError     = "error"     // the store failed
)

// Event describes a phase of a request to an Observer. It is passed by
// value, so that observing costs the request path no allocation of its own.
type Event struct {
	Phase Phase
	// Request is the request as an HTTP request: the request itself on
	// idemhttp; on another face, what the face describes it as (idemgrpc:
	// a POST of application/grpc to the full method name), so that an
	// observer written for HTTP names it sensibly.
	Request *http.Request
	// Store is the key store's type, as fmt's %T prints it
	// ("*idemsqlite.Store"): what the spans and series of several stores
	// are told apart by.
	Store string
	// Scope and Key are the request's, once the key has been read (empty
	// before, and for a request refused for its key). Never export Key as
	// it is: it may be a secret of the client's. idem.KeyDigest(Scope, Key)
	// correlates without revealing it.
	Scope idem.Scope
	Key   idem.Key

	// Set when the phase ends.

	// Duration is how long the phase took.
	Duration time.Duration
	// Outcome is the request's, at the end of PhaseRequest; empty for the
	// other phases.
	Outcome Outcome
	// Claim is the claim's result at the end of PhaseClaim: one of
	// ClaimAcquired, ClaimCompleted, ClaimMismatch, ClaimInFlight,
	// ClaimError.
	Claim string
	// TookOver is set at the end of a PhaseClaim that took over a key
	// whose lease had ended.
	TookOver bool
	// Status is the answer's status on HTTP's scale (Ran.Status), at the
	// end of PhaseHandler, PhaseReplay and PhaseRequest; 0 where none was
	// written.
	Status int
	// Err is what failed in the phase, if anything: the store's error, or
	// the handler's failure ("panicked", "timed out").
	Err error
}

// Observer sees the phases of every request and every round trip to the
// store, for tracing and latency histograms (packages idemotel and idemprom
// implement it). Its methods run on the request's goroutine, so they must
// be quick, and safe for concurrent use. Config.Observer nil calls nothing
// and costs nothing.
type Observer interface {
	// Begin is called as a phase starts, and returns the context of the
	// phase: the handler's context is derived from PhaseHandler's, the
	// later phases' from PhaseRequest's, and End receives the phase's own.
	// An observer with nothing to carry returns ctx.
	Begin(ctx context.Context, e Event) context.Context
	// End is called once the phase has ended, with the context Begin
	// returned for it.
	End(ctx context.Context, e Event)
	// Store is called after each round trip to the store, with how long it
	// took and its error.
	Store(ctx context.Context, op StoreOp, d time.Duration, err error)
}

// Observers returns an Observer that calls each of obs in turn (nil ones
// skipped): the context each Begin returns is passed to the next, so
// tracing and histograms can watch one engine together. With no observer
// left it returns nil, which observes nothing.
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

func (t observers) Store(ctx context.Context, op StoreOp, d time.Duration, err error) {
	for _, o := range t {
		o.Store(ctx, op, d, err)
	}
}

// observed is the context of an observed request: PhaseRequest's, and the
// request's state its phases report. Being a context itself, it costs one
// allocation per observed request, and none when the engine has no
// Observer.
type observed struct {
	context.Context
	e       Event
	start   time.Time
	outcome Outcome
	status  int
	// mark is when the round trip to the store in progress began.
	mark time.Time
	// phases holds each phase begun and not yet ended: its context (nil
	// when none is) and start.
	phases [PhaseReplay + 1]struct {
		ctx   context.Context
		start time.Time
	}
}

type observedKey struct{}

func (o *observed) Value(key any) any {
	if _, ok := key.(observedKey); ok {
		return o
	}
	return o.Context.Value(key)
}

// observedFrom returns the observed request ctx belongs to, or nil.
func observedFrom(ctx context.Context) *observed {
	o, _ := ctx.Value(observedKey{}).(*observed)
	return o
}

// Observed reports whether the engine has an Observer: a face that must
// make something only for it (idemgrpc's description of a call as an HTTP
// request) makes it only then.
func (e *Engine) Observed() bool { return e.obs != nil }

// Begin begins PhaseRequest of a request the face is about to serve, r
// being the request as an HTTP request (Event.Request), and returns the
// context to serve it with: pass it to Reject and Serve, and to End once
// the request is answered. Without an Observer it returns ctx and does
// nothing, at no cost.
func (e *Engine) Begin(ctx context.Context, r *http.Request) context.Context {
	if e.obs == nil {
		return ctx
	}
	ev := Event{Phase: PhaseRequest, Request: r, Store: e.storeName}
	o := &observed{e: ev, start: time.Now()}
	o.Context = e.obs.Begin(ctx, ev)
	return o
}

// End ends PhaseRequest of the request Begin began with ctx, with the
// outcome and status it came to.
func (e *Engine) End(ctx context.Context) {
	if e.obs == nil {
		return
	}
	o, ok := ctx.(*observed)
	if !ok {
		return
	}
	ev := o.e
	ev.Phase, ev.Duration, ev.Outcome, ev.Status = PhaseRequest, time.Since(o.start), o.outcome, o.status
	e.obs.End(o.Context, ev)
}

// tally counts an outcome and, when the request is observed, records it
// as the request's.
func (e *Engine) tally(ctx context.Context, outcome Outcome) {
	e.count(outcome)
	if e.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil {
		o.outcome = outcome
	}
}

// noteKey records the scope and key of ctx's observed request, once read.
func (e *Engine) noteKey(ctx context.Context, scope idem.Scope, key idem.Key) {
	if e.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil {
		o.e.Scope, o.e.Key = scope, key
	}
}

// beginPhase starts phase p of ctx's observed request and returns the
// phase's context. It returns ctx, and begins nothing, when there is no
// Observer or p has begun already: then the End of the phase begun first
// ends it.
func (e *Engine) beginPhase(ctx context.Context, p Phase) context.Context {
	if e.obs == nil {
		return ctx
	}
	o := observedFrom(ctx)
	if o == nil || o.phases[p].ctx != nil {
		return ctx
	}
	ev := o.e
	ev.Phase = p
	pctx := e.obs.Begin(ctx, ev)
	o.phases[p].ctx, o.phases[p].start = pctx, time.Now()
	return pctx
}

// endPhase ends phase p of ctx's observed request, if it has begun; ev
// carries what the phase ended with.
func (e *Engine) endPhase(ctx context.Context, p Phase, ev Event) {
	if e.obs == nil {
		return
	}
	o := observedFrom(ctx)
	if o == nil || o.phases[p].ctx == nil {
		return
	}
	ph := &o.phases[p]
	ev.Phase, ev.Request, ev.Store, ev.Scope, ev.Key = p, o.e.Request, o.e.Store, o.e.Scope, o.e.Key
	ev.Duration = time.Since(ph.start)
	if ev.Status != 0 {
		o.status = ev.Status
	}
	pctx := ph.ctx
	ph.ctx = nil
	e.obs.End(pctx, ev)
}

// markStore notes the start of a round trip to the store, which
// storeSince reports; both do nothing when ctx's request is not observed.
func (e *Engine) markStore(ctx context.Context) {
	if e.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil {
		o.mark = time.Now()
	}
}

// storeSince reports the round trip to the store begun at the last
// markStore.
func (e *Engine) storeSince(ctx context.Context, op StoreOp, err error) {
	if e.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil && !o.mark.IsZero() {
		e.obs.Store(ctx, op, time.Since(o.mark), err)
	}
}

// failureErr is a handler's failure as an Event's Err.
func failureErr(failure string) error {
	if failure == "" {
		return nil
	}
	return errors.New("handler " + failure)
}
