package idemgrpc

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Execution describes the protected call whose handler is running.
type Execution struct {
	Scope idem.Scope
	// Key is the key as the store keeps it: sealed, with Config.KeySecret.
	Key idem.Key
	// FullMethod is the call's method, "/package.Service/Method".
	FullMethod string
	// Token is this execution's fencing token.
	Token idem.Token
	// ClaimedAt is the key's Record.CreatedAt: the same for every execution
	// of one logical call (a takeover after a crash keeps it), different
	// once the key expired and was claimed anew. (Scope, Key, ClaimedAt) is
	// what an effect outside the key store records under a unique
	// constraint, so that a re-run finds the earlier effect.
	ClaimedAt time.Time
	// TookOver reports that an earlier execution's lease ended before it
	// finished: it may have crashed half-way, or be still running.
	TookOver bool
	// Recovery is the recovery point an earlier execution of the key saved
	// (SaveRecovery): the phase to go on from. Zero for a first execution,
	// and whenever the store keeps no points.
	Recovery idem.RecoveryPoint

	// engine is the engine's Execution, which the downstream keys derive
	// from (it knows the request's seed, which sealing does not change);
	// zero in an Execution made outside the interceptor.
	engine keyed.Execution
}

type execKey struct{}

// execution is what the handler's context carries: the Execution, and how
// many calls to each method the handler has made through a Client, which
// numbers the keys passed on (DownstreamKey).
type execution struct {
	Execution
	mu    sync.Mutex
	calls map[string]int
}

// ExecutionFromContext returns the protected call's Execution, inside its
// handler.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	e, ok := ctx.Value(execKey{}).(*execution)
	if !ok {
		return Execution{}, false
	}
	return e.Execution, true
}

// KeyFromContext returns the scope and key of the protected call whose
// handler is running.
func KeyFromContext(ctx context.Context) (idem.Scope, idem.Key, bool) {
	e, ok := ExecutionFromContext(ctx)
	return e.Scope, e.Key, ok
}

// DownstreamKey returns the key a handler's n-th call (from 0) to
// fullMethod is sent with, numbering its calls to each method in the order
// they are made: Execution.DownstreamKey(fullMethod, n), the key a Client
// gives a call that is not named (WithCallName).
//
// Deprecated: a number depends on the order the calls are made in, which
// is not the same in every execution when they are made concurrently, and
// a re-execution would then send one call's key with another. Name the
// call instead: Execution.DownstreamKey, or WithCallName for a Client's
// call. Its keys are Execution.DownstreamKey(fullMethod, n), pinned by a
// test, so that an execution resumed on a newer version sends the keys its
// predecessor sent.
func DownstreamKey(ex Execution, fullMethod string, n int) string {
	return ex.DownstreamKey(fullMethod, strconv.Itoa(n))
}

// DownstreamKey returns the key ex sends with its call named name (and
// parts) to another service: the same for every execution of one logical
// call, whatever order its calls are made in, and on every face: the
// engine's (keyed.Execution.DownstreamKey), which says how to name a call.
func (ex Execution) DownstreamKey(name string, parts ...string) string {
	if ex.engine.Key != "" {
		return ex.engine.DownstreamKey(name, parts...)
	}
	return keyed.Execution{Scope: ex.Scope, Key: ex.Key, Token: ex.Token, ClaimedAt: ex.ClaimedAt, TookOver: ex.TookOver,
		Recovery: ex.Recovery}.DownstreamKey(name, parts...)
}

// WithCallName returns a context whose calls, made through a Client, carry
// the downstream key of the call named name (and parts), as
// Execution.DownstreamKey derives it from the execution ctx belongs to
// (keyed.DownstreamKey): a handler that calls several services at once,
// from goroutines, names each call, and every execution sends each call
// with the same key whichever starts first. Outside a protected call's
// handler it returns ctx as it is, and a Client gives the call a fresh
// key. A call whose outgoing metadata already holds an idempotency-key
// keeps its own.
func WithCallName(ctx context.Context, name string, parts ...string) context.Context {
	key, ok := keyed.DownstreamKey(ctx, name, parts...)
	if !ok {
		return ctx
	}
	return WithKey(ctx, key)
}

// nextKey is the key of the handler's next call to fullMethod that is not
// named.
func (e *execution) nextKey(fullMethod string) string {
	e.mu.Lock()
	n := e.calls[fullMethod]
	if e.calls == nil {
		e.calls = make(map[string]int)
	}
	e.calls[fullMethod] = n + 1
	e.mu.Unlock()
	return e.Execution.DownstreamKey(fullMethod, strconv.Itoa(n))
}

type keyContextKey struct{}

// WithKey returns a context whose calls, made through a Client, carry key
// as their idempotency key instead of a fresh one: for a key that must
// survive the process (kept with the operation it names, so that a retry
// after a restart is still the same operation). A call whose outgoing
// metadata already holds an idempotency-key keeps its own.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// ErrNoRecovery is returned by SaveRecovery when the call cannot keep
// recovery points: it is not a protected call, the store is no
// idem.Recoverer, or the handler runs inside the store's transaction (the
// same-transaction forms), where a point would roll back with everything
// else on a failure. Phases need the claim-first form: Config.SeparateTx.
// It is keyed.ErrNoRecovery.
var ErrNoRecovery = keyed.ErrNoRecovery

// SaveRecovery records, from a handler's context, that the protected call
// reached the phase name, with data what the next phases need, in the
// key's record: keyed.SaveRecovery, which says what it promises. Once a
// call saved a point, its key is never released after a failure: it stays
// in flight with its point, its lease yielded, for the client's retry
// (which goes on from Execution.Recovery) or a Completer.
//
// It is the engine's own function, not a wrapper: the face decides nothing
// about a key's point.
var SaveRecovery = keyed.SaveRecovery
