package keyed

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

type ctxKey struct{}

// execCtx is the handler's context. It behaves as
// context.WithValue(context.WithDeadline(context.WithoutCancel(parent),
// deadline), ctxKey{}, ex): it carries parent's values, not its
// cancellation (a caller that leaves does not cut its execution short:
// the answer is kept for its retry), and ends at its own deadline, or
// when its lease cannot be kept (fail). It makes the deadline's context (a
// timer, and a registration with the parent) only once something asks for
// more than the Execution, the deadline or a value the parent carries:
// Done, Err, or a value the parent lacks. A handler that never waits on its
// context (a trivial one, or grpc-go's path to it, which reads the
// parent's values) then costs no timer, and one that does sees exactly
// what WithDeadline gives.
type execCtx struct {
	parent   context.Context
	deadline time.Time
	ex       Execution
	noEx     bool // carries no Execution of its own (detached's)
	// points is ex.points when the store keeps recovery points: part of
	// the context, so an execution costs no allocation of its own for it.
	points pointSaver

	// vals is context.WithoutCancel(parent), made on the first lookup of
	// another value: the parent's values, none of its cancellation.
	vals    atomic.Value                // of context.Context
	inner   atomic.Pointer[deadlineCtx] // nil until needed
	mu      sync.Mutex                  // serialises making inner, stop and fail
	stopped bool
	lost    error // fail's cause, once it failed
	// early says that stop or fail, whichever came first, came before the
	// deadline: a context made later ends as they did, not by its deadline.
	early bool
}

type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	fail   context.CancelCauseFunc
}

func newExecCtx(parent context.Context, timeout time.Duration, ex Execution) *execCtx {
	c := &execCtx{ex: ex}
	c.init(parent, timeout)
	return c
}

// newExecCtxUntil is newExecCtx ending at deadline.
func newExecCtxUntil(parent context.Context, deadline time.Time, ex Execution) *execCtx {
	c := &execCtx{ex: ex}
	c.parent, c.deadline = parent, deadline
	return c
}

// init makes c the context of its Execution (c.ex), under parent, ending
// after timeout.
func (c *execCtx) init(parent context.Context, timeout time.Duration) {
	c.parent, c.deadline = parent, time.Now().Add(timeout)
	c.vals = atomic.Value{} // parent's values, not an earlier one's
}

// ctx returns the deadline's context, making it on first use; once stop
// or fail has run it is made cancelled.
func (c *execCtx) ctx() context.Context {
	if in := c.inner.Load(); in != nil {
		return in.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.inner.Load(); in != nil {
		return in.ctx
	}
	base, fail := context.WithCancelCause(c.values())
	if c.early {
		switch {
		case c.lost != nil:
			fail(c.lost)
		case c.stopped:
			fail(context.Canceled)
		}
	}
	ctx, cancel := context.WithDeadline(base, c.deadline)
	switch {
	case c.lost != nil:
		fail(c.lost)
	case c.stopped:
		cancel()
	}
	c.inner.Store(&deadlineCtx{ctx: ctx, cancel: cancel, fail: fail})
	return ctx
}

// stop cancels the context, as the CancelFunc of WithDeadline does.
func (c *execCtx) stop() {
	c.mu.Lock()
	if !c.stopped && c.lost == nil {
		c.early = time.Now().Before(c.deadline)
	}
	c.stopped = true
	in := c.inner.Load()
	c.mu.Unlock()
	if in != nil {
		in.cancel()
	}
}

// fail cancels the context with cause, unless it has ended already: the
// execution's lease cannot be kept.
func (c *execCtx) fail(cause error) {
	c.mu.Lock()
	if c.lost == nil && !c.stopped {
		c.lost = cause
		c.early = time.Now().Before(c.deadline)
	}
	in := c.inner.Load()
	c.mu.Unlock()
	if in != nil {
		in.fail(cause)
	}
}

// failed returns fail's cause, or nil.
func (c *execCtx) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost
}

func (c *execCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *execCtx) Done() <-chan struct{} { return c.ctx().Done() }

func (c *execCtx) Err() error { return c.ctx().Err() }

func (c *execCtx) String() string {
	return fmt.Sprintf("%v.WithoutCancel.WithDeadline(%s).WithValue(keyed.Execution)", c.parent, c.deadline)
}

func (c *execCtx) Value(key any) any {
	if _, ok := key.(ctxKey); ok {
		if c.noEx {
			return c.parent.Value(key)
		}
		return c.ex
	}
	if in := c.inner.Load(); in != nil {
		return in.ctx.Value(key)
	}
	// The deadline's context answers every other key as WithoutCancel(parent)
	// does, but for the context package's own lookups (for cancellation
	// and Cause), which must find the deadline's context: WithoutCancel
	// answers those nil, since it hides the parent's cancellation. So a
	// value found there is the answer, and only a key found nowhere makes
	// the deadline's context to be asked.
	if v := c.values().Value(key); v != nil {
		return v
	}
	return c.ctx().Value(key)
}

// values returns context.WithoutCancel(c.parent), making it on first use.
func (c *execCtx) values() context.Context {
	if v, ok := c.vals.Load().(context.Context); ok {
		return v
	}
	v := context.WithoutCancel(c.parent)
	if !c.vals.CompareAndSwap(nil, v) {
		return c.vals.Load().(context.Context)
	}
	return v
}

// Execution describes the request whose handler is running.
type Execution struct {
	Scope idem.Scope
	// Key is the key as the store keeps it: sealed, with Config.KeySecret.
	Key idem.Key
	// Token is this execution's fencing token.
	Token idem.Token
	// ClaimedAt is the key's Record.CreatedAt: the same for every execution
	// of one logical request (a takeover after a crash keeps it), different
	// once the key expired and was claimed anew. (Scope, Key, ClaimedAt) is
	// what an effect outside the key store records under a unique constraint
	// so that a re-run finds the earlier effect instead of repeating it.
	ClaimedAt time.Time
	// TookOver reports that an earlier execution's lease ended before it
	// finished: it may have crashed half-way, or be still running.
	TookOver bool
	// Recovery is the recovery point an earlier execution of the key saved
	// (see SaveRecovery): the phase to go on from. Zero for a first
	// execution, and whenever the store keeps no points.
	Recovery idem.RecoveryPoint

	// points saves this execution's recovery points; nil when it cannot.
	points *pointSaver
	// seed is what downstreamKey derives from (see downstreamSeed), when
	// hasSeed: the engine made the Execution.
	seed    [32]byte
	hasSeed bool
}

// ExecutionFromContext returns the Execution of the request whose handler
// ctx belongs to.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	e, ok := ctx.Value(ctxKey{}).(Execution)
	return e, ok
}

// KeyFromContext returns the scope and key of the request whose handler
// is running, so the handler can pass the key downstream as the
// idempotency key of the next call.
func KeyFromContext(ctx context.Context) (idem.Scope, idem.Key, bool) {
	e, ok := ExecutionFromContext(ctx)
	return e.Scope, e.Key, ok
}

// detached is the context for writing an outcome after the effect: a client
// hanging up must not leave the key in flight.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	// An execCtx with no Execution of its own (the request's, if any,
	// comes from ctx): its timer is made only if the store asks for Done
	// or Err (rueidis reads the deadline alone), which saves a first
	// execution on Redis about a microsecond.
	c := newExecCtx(ctx, 10*time.Second, Execution{})
	c.noEx = true
	return c, c.stop
}

// detachedUntil is detached ending at deadline rather than after a write's
// time: a completer round's last writes, which its Timeout bounds.
func detachedUntil(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	c := newExecCtxUntil(ctx, deadline, Execution{})
	c.noEx = true
	return c, c.stop
}
