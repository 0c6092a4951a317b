package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// ResumeFunc finishes an abandoned call from its recovery point
// (ex.Recovery), with nobody waiting for the answer: it does what the
// handler's remaining phases would, and answers as the handler would, a
// response message or a status error. ctx carries ex, so SaveRecovery and
// KeyFromContext work as in the handler, and ends at
// CompleterConfig.Timeout. ex.FullMethod is empty: a key's record does not
// say which method it was claimed by, so dispatch on ex.Recovery.Name.
//
// An answer the interceptor would keep (Config.Keep: OK, or a
// deterministic status such as FailedPrecondition) is kept, and the
// client's retry gets it replayed. Returning ErrNothingDone releases the
// key. Any other error (a transient status, or not a status at all) leaves
// the key in flight with its point: its outcome is unknown, and the
// Completer tries again once the lease it took ends.
type ResumeFunc func(ctx context.Context, ex Execution) (any, error)

// ErrNothingDone is what a Resume returns when it learned that nothing
// happened past the database's edge: the Completer then releases the key,
// and the client's retry runs the call anew. It is keyed.ErrNothingDone.
var ErrNothingDone = keyed.ErrNothingDone

// CompleterConfig configures a Completer.
type CompleterConfig struct {
	// Resume finishes one abandoned call. Required.
	Resume ResumeFunc
	// Every is how often the Completer looks for abandoned executions.
	// Defaults to 1s.
	Every time.Duration
	// Timeout bounds one Resume (whose lease is renewed while it runs),
	// and is part of the Completer's Bound. Defaults to nine tenths of the
	// lease.
	Timeout time.Duration
	// Limit is how many abandoned keys one round takes on. Defaults to 100.
	Limit int
	// Parallel is how many of a round's keys are resumed at once. Defaults
	// to 16.
	Parallel int
	// Logger defaults to the Interceptor's.
	Logger *slog.Logger
	// Points names the recovery points this Completer resumes; a key
	// abandoned at another point is left to the Completer that names it
	// (keyed.CompleterConfig.Points): another face's on the same store,
	// say, which keeps its answers in its own form. Defaults to none:
	// every point.
	Points []string
}

// Completer finishes, in the background, the calls whose holder died after
// saving a recovery point: the engine's (keyed.Completer), which says how
// and within what bound. Make one with Interceptor.NewCompleter, run it
// with Run.
type Completer = keyed.Completer

// NewCompleter returns a Completer for i's store, which must be an
// idem.Recoverer. It keeps answers as i keeps them: the metadata i
// replays is not there to keep (a Resume sets none), the message sealed
// with Config.BodyKeys.
func (i *Interceptor) NewCompleter(cfg *CompleterConfig) (*Completer, error) {
	var c CompleterConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Resume == nil {
		return nil, &idem.ArgumentError{Field: "idemgrpc.CompleterConfig.Resume", Reason: "is required"}
	}
	resume := c.Resume
	comp, err := i.eng.NewCompleter(&keyed.CompleterConfig{Every: c.Every, Timeout: c.Timeout, Limit: c.Limit, Parallel: c.Parallel, Logger: c.Logger, Points: c.Points,
		Resume: func(ctx context.Context, kex keyed.Execution) (idem.Response, error) {
			ex := Execution{Scope: kex.Scope, Key: kex.Key, Token: kex.Token, ClaimedAt: kex.ClaimedAt, TookOver: kex.TookOver, Recovery: kex.Recovery, engine: kex}
			ctx = context.WithValue(ctx, execKey{}, &execution{Execution: ex})
			resp, rerr := resume(ctx, ex)
			if errors.Is(rerr, keyed.ErrNothingDone) {
				return idem.Response{}, rerr
			}
			if _, isStatus := status.FromError(rerr); !isStatus || !i.cfg.Keep("", status.Code(rerr)) {
				return idem.Response{}, rerr
			}
			kept, overflow, err := i.keptAnswer(resp, rerr, nil)
			switch {
			case err != nil:
				return idem.Response{}, err
			case overflow:
				return idem.Response{}, fmt.Errorf("the answer exceeds %d bytes, the most that is kept", i.cfg.MaxResponseBytes)
			}
			return kept, nil
		}})
	if err != nil {
		return nil, err
	}
	return comp, nil
}
