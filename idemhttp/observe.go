package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-go/idem"
)

// Phase is a step of a protected request, as an Observer sees it.
type Phase uint8

// Phases, in the order a first execution goes through them. A request
// always has PhaseRequest around the others; a replay has PhaseReplay
// where an execution has PhaseHandler and PhaseComplete.
const (
	// PhaseRequest is the whole protected request, from the middleware's
	// first look at it to its answer. Its End carries the Outcome.
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

// Event describes a phase of a protected request to an Observer. It is
// passed by value, so that observing costs the request path no allocation
// of its own.
type Event struct {
	Phase Phase
	// Request is the protected request, as it reached the middleware.
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
	// Status is the answer's status, at the end of PhaseHandler,
	// PhaseReplay and PhaseRequest; 0 where none was written.
	Status int
	// Err is what failed in the phase, if anything: the store's error, or
	// the handler's failure ("panicked", "timed out").
	Err error
}

// Observer sees the phases of every protected request and every round trip
// to the store, for tracing and latency histograms (packages idemotel and
// idemprom implement it). Its methods run on the request's goroutine, so
// they must be quick, and safe for concurrent use. Config.Observer nil
// calls nothing and costs nothing.
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
// tracing and histograms can watch one middleware together. With no
// observer left it returns nil, which observes nothing.
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
// allocation per observed request, and none when the middleware has no
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

// serveObserved is serve with PhaseRequest around it.
func (m *Middleware) serveObserved(next http.Handler, w http.ResponseWriter, r *http.Request) {
	e := Event{Phase: PhaseRequest, Request: r, Store: m.storeName}
	o := &observed{e: e, start: time.Now()}
	o.Context = m.obs.Begin(r.Context(), e)
	defer func() {
		e := o.e
		e.Phase, e.Duration, e.Outcome, e.Status = PhaseRequest, time.Since(o.start), o.outcome, o.status
		m.obs.End(o.Context, e)
	}()
	m.serve(next, w, r.WithContext(o))
}

// tally counts an outcome and, when the request is observed, records it
// as the request's.
func (m *Middleware) tally(ctx context.Context, outcome Outcome) {
	m.count(outcome)
	if m.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil {
		o.outcome = outcome
	}
}

// noteKey records the scope and key of ctx's observed request, once read.
func (m *Middleware) noteKey(ctx context.Context, scope idem.Scope, key idem.Key) {
	if m.obs == nil {
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
func (m *Middleware) beginPhase(ctx context.Context, p Phase) context.Context {
	if m.obs == nil {
		return ctx
	}
	o := observedFrom(ctx)
	if o == nil || o.phases[p].ctx != nil {
		return ctx
	}
	e := o.e
	e.Phase = p
	pctx := m.obs.Begin(ctx, e)
	o.phases[p].ctx, o.phases[p].start = pctx, time.Now()
	return pctx
}

// endPhase ends phase p of ctx's observed request, if it has begun; e
// carries what the phase ended with.
func (m *Middleware) endPhase(ctx context.Context, p Phase, e Event) {
	if m.obs == nil {
		return
	}
	o := observedFrom(ctx)
	if o == nil || o.phases[p].ctx == nil {
		return
	}
	ph := &o.phases[p]
	e.Phase, e.Request, e.Store, e.Scope, e.Key = p, o.e.Request, o.e.Store, o.e.Scope, o.e.Key
	e.Duration = time.Since(ph.start)
	if e.Status != 0 {
		o.status = e.Status
	}
	pctx := ph.ctx
	ph.ctx = nil
	m.obs.End(pctx, e)
}

// markStore notes the start of a round trip to the store, which
// storeSince reports; both do nothing when ctx's request is not observed.
func (m *Middleware) markStore(ctx context.Context) {
	if m.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil {
		o.mark = time.Now()
	}
}

// storeSince reports the round trip to the store begun at the last
// markStore.
func (m *Middleware) storeSince(ctx context.Context, op StoreOp, err error) {
	if m.obs == nil {
		return
	}
	if o := observedFrom(ctx); o != nil && !o.mark.IsZero() {
		m.obs.Store(ctx, op, time.Since(o.mark), err)
	}
}

// endReplay ends PhaseReplay of a duplicate answered with resp, or
// refused because resp could not be read.
func (m *Middleware) endReplay(ctx context.Context, resp *idem.Response) {
	if m.obs == nil {
		return
	}
	status := http.StatusOK
	if resp != nil {
		status = resp.Status
	}
	if o := observedFrom(ctx); o != nil && o.outcome != OutcomeReplayed {
		status = http.StatusInternalServerError
	}
	m.endPhase(ctx, PhaseReplay, Event{Status: status})
}

// failureErr is a handler's failure as an Event's Err.
func failureErr(failure string) error {
	if failure == "" {
		return nil
	}
	return errors.New("handler " + failure)
}
