package idemhttp

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Execution describes the protected request whose handler is running: the
// engine's (keyed.Execution), the same on every face. Its Key is sealed
// with Config.KeySecret.
type Execution = keyed.Execution

// ExecutionFromContext returns the protected request's Execution.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	return keyed.ExecutionFromContext(ctx)
}

// KeyFromContext returns the scope and key of the protected request whose
// handler is running, so the handler can pass the key downstream as the
// idempotency key of the next call.
func KeyFromContext(ctx context.Context) (idem.Scope, idem.Key, bool) {
	return keyed.KeyFromContext(ctx)
}
