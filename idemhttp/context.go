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
// handler is running. To pass the key on downstream, derive one per call
// from it: DownstreamKey, or WithCallName for a RoundTripper's request.
func KeyFromContext(ctx context.Context) (idem.Scope, idem.Key, bool) {
	return keyed.KeyFromContext(ctx)
}

// DownstreamKey returns the key the protected request's handler sends
// with its call named name (and parts) to another service: the engine's
// (keyed.DownstreamKey), the same on every face and for every execution
// of the request, whatever order its calls are made in. False outside a
// protected request's handler.
func DownstreamKey(ctx context.Context, name string, parts ...string) (string, bool) {
	return keyed.DownstreamKey(ctx, name, parts...)
}
