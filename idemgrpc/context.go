package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
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
// fullMethod is sent with: a digest of the execution's scope and key, the
// method and n, so that every execution of one logical call (a retry after
// a transient failure, or one that takes over after a crash) sends the
// same keys downstream, in the same order, and the services called replay
// what an earlier execution asked of them rather than run it again; two
// calls to one method in one execution get two keys. A Client numbers the
// calls itself; DownstreamKey is for keys sent some other way (an HTTP
// call through idemhttp.WithKey, say).
func DownstreamKey(ex Execution, fullMethod string, n int) string {
	var buf []byte
	for _, f := range []string{string(ex.Scope), string(ex.Key), fullMethod, strconv.Itoa(n)} {
		buf = binary.AppendUvarint(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	sum := sha256.Sum256(buf)
	return "idg1_" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// nextKey is the key of the handler's next call to fullMethod.
func (e *execution) nextKey(fullMethod string) string {
	e.mu.Lock()
	n := e.calls[fullMethod]
	if e.calls == nil {
		e.calls = make(map[string]int)
	}
	e.calls[fullMethod] = n + 1
	e.mu.Unlock()
	return DownstreamKey(e.Execution, fullMethod, n)
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

// detached is the context for writing an outcome after the effect: a
// client hanging up must not leave the key in flight.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}
