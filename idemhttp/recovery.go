package idemhttp

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// ErrNoRecovery is returned by SaveRecovery when the protected request
// cannot keep recovery points: it is not a protected request, the store is
// no idem.Recoverer, or the handler runs inside the store's transaction
// (the same-transaction forms), where a point would roll back with
// everything else on a failure and so say nothing. Phases need the
// claim-first form: Config.SeparateTx. It is keyed.ErrNoRecovery.
var ErrNoRecovery = keyed.ErrNoRecovery

// SaveRecovery records that the protected request ctx belongs to reached
// the phase name, with data what the next phases need, in the key's
// record: keyed.SaveRecovery, which says what it promises.
//
// Once an execution saved a point, its key is never released after a
// failure: whatever the phases did past the database's edge may have
// happened. The key stays in flight with its point and the execution
// yields its lease, so the client's retry takes it over at once and goes
// on from the point (Execution.Recovery), or, with nobody asking, a
// Completer does.
//
// Returns ErrNoRecovery (see there), an *idem.ArgumentError for a malformed
// point, or idem.ErrLeaseLost when another execution took the key over.
//
// It is the engine's own function, not a wrapper: the face decides nothing
// about a key's point.
var SaveRecovery = keyed.SaveRecovery

// ErrNothingDone is what a Resume returns when it learned that nothing
// happened past the database's edge (the card network has no charge under
// the execution's key, say): the Completer then releases the key, and the
// client's retry runs the request anew. It is keyed.ErrNothingDone.
var ErrNothingDone = keyed.ErrNothingDone

// ResumeFunc finishes an abandoned execution from its recovery point
// (ex.Recovery), with nobody waiting for the answer: it does what the
// handler's remaining phases would, and writes to w the answer the client
// would have got, which the Completer keeps for the client's retry. ctx
// carries ex, so SaveRecovery and KeyFromContext work as in the handler,
// and ends at CompleterConfig.Timeout.
//
// Returning nil keeps what was written, whatever its status. Returning
// ErrNothingDone releases the key. Any other error leaves the key in flight
// with its point: its outcome is unknown, and the Completer tries again
// once the lease it took ends.
type ResumeFunc func(ctx context.Context, w http.ResponseWriter, ex Execution) error

// CompleterConfig configures a Completer.
type CompleterConfig struct {
	// Resume finishes one abandoned execution. Required. One Completer
	// serves every route of its Middleware's store: dispatch on
	// ex.Recovery.Name.
	Resume ResumeFunc
	// Every is how often the Completer looks for abandoned executions.
	// Defaults to 1s.
	Every time.Duration
	// Timeout bounds one round, from its start: its listing of the
	// abandoned keys, the claim that takes each over, each Resume (whose
	// lease is renewed while it runs) and the keeping of its answer. It is
	// part of the Completer's Bound. Defaults to nine tenths of the lease.
	Timeout time.Duration
	// Limit is how many abandoned keys one round takes on. Defaults to 100.
	Limit int
	// Parallel is how many of a round's keys are resumed at once. Defaults
	// to 16.
	Parallel int
	// Logger defaults to the Middleware's.
	Logger *slog.Logger
	// Points names the recovery points this Completer resumes; a key
	// abandoned at another point is left to the Completer that names it
	// (keyed.CompleterConfig.Points): another face's on the same store,
	// say, which keeps its answers in its own form. Defaults to none:
	// every point.
	Points []string
}

// Completer finishes, in the background, the executions whose holder died
// after saving a recovery point: the engine's (keyed.Completer), which says
// how and within what bound. Make one with Middleware.NewCompleter, run it
// with Run.
type Completer = keyed.Completer

// CompleterStats counts what a Completer did since it was made.
type CompleterStats = keyed.CompleterStats

// NewCompleter returns a Completer for m's store, which must be an
// idem.Recoverer. Its takeovers use m's lease and TTL, and it keeps answers
// as m keeps them: the headers m replays, the body sealed with
// Config.BodyKeys; an answer over Config.MaxResponseBytes is an unknown
// outcome, tried again.
func (m *Middleware) NewCompleter(cfg *CompleterConfig) (*Completer, error) {
	var c CompleterConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Resume == nil {
		return nil, &idem.ArgumentError{Field: "idemhttp.CompleterConfig.Resume", Reason: "is required"}
	}
	resume := c.Resume
	comp, err := m.eng.NewCompleter(&keyed.CompleterConfig{Every: c.Every, Timeout: c.Timeout, Limit: c.Limit, Parallel: c.Parallel, Logger: c.Logger, Points: c.Points,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			w := newRecorder(nil, m.cfg.MaxResponseBytes, false)
			if err := resume(ctx, w, ex); err != nil {
				return idem.Response{}, err
			}
			if w.overflow {
				return idem.Response{}, fmt.Errorf("the answer exceeded %d bytes, the most that is kept", m.cfg.MaxResponseBytes)
			}
			return m.keptResponse(w), nil
		}})
	if err != nil {
		return nil, renamedCompleter(err)
	}
	return comp, nil
}

// renamedCompleter is err, an error of keyed.Engine.NewCompleter, naming
// what idemhttp's caller gave.
func renamedCompleter(err error) error {
	if ae, ok := err.(*idem.ArgumentError); ok {
		field := ae.Field
		switch {
		case field == "keyed.Engine":
			field = "idemhttp.Middleware"
		case len(field) > len("keyed.") && field[:len("keyed.")] == "keyed.":
			field = "idemhttp." + field[len("keyed."):]
		}
		return &idem.ArgumentError{Field: field, Reason: ae.Reason}
	}
	return err
}
