package keyed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
)

// execution is a request whose key the engine claims, and, once it has,
// the execution of its handler: one allocation holds both, the handler's
// context included.
type execution struct {
	call
	hctx execCtx
	ref  idem.Ref
	// expires is when the key's record expires, for the memory of recent
	// keys.
	expires time.Time
	// ran is what the handler did; once the answer is kept, ran.Answer is
	// what the store keeps (its body sealed, or dropped).
	ran Ran
	// watch is the request's watch for this process's completion of the
	// key, while it waits for an execution in flight.
	watch keyWatch
	// held is the execution's lease, renewed while it runs (outside the
	// ClaimTx form, whose claim no other transaction sees before it
	// commits).
	held heldLease
	// sent is when the claim that acquired the key was sent; granted is
	// when the lease it acquired ends, as the store answered it.
	sent, granted time.Time
	// pointErr says why the key's recovery point cannot be read: the
	// handler is not run.
	pointErr error
	// leaseEnds is when the lease of the execution in flight that a
	// duplicate waits for ends, as its last claim found it; zero when not
	// known.
	leaseEnds time.Time
}

// acquired records the claim the execution runs under.
func (x *execution) acquired(claim idem.Claim) {
	x.ref = idem.Ref{Scope: x.req.Scope, Key: x.req.Key, Token: claim.Token}
	x.expires, x.granted = claim.Record.ExpiresAt, claim.Record.LeaseExpiresAt
	x.hctx.ex = Execution{Scope: x.req.Scope, Key: x.req.Key, Token: claim.Token,
		ClaimedAt: claim.Record.CreatedAt, TookOver: claim.TookOver, hasSeed: true}
	x.hctx.ex.seed = downstreamSeed(x.req.Scope, x.clientKey)
	if !claim.Record.Recovery.IsZero() {
		rp, seed, err := unwrapPoint(x.e.bodies, x.req.Scope, x.req.Key, claim.Record.Recovery)
		if err != nil {
			// The handler must not run as a first execution would (its
			// effect may have happened), nor from data it cannot read: it
			// does not run, and the key stays in flight with its point.
			x.pointErr = err
			rp = idem.RecoveryPoint{Name: claim.Record.Recovery.Name, SavedAt: claim.Record.Recovery.SavedAt}
		} else {
			x.hctx.ex.seed = seed
		}
		x.hctx.ex.Recovery = rp
	}
	if claim.TookOver {
		x.log.LogAttrs(x.ctx, slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(claim.Token)))
	}
}

// handlerCtx makes the handler's context, with parent its values' source
// (the handler phase's context), inTx saying whether the handler runs
// inside the store's transaction.
func (x *execution) handlerCtx(parent context.Context, inTx bool) *execCtx {
	e := x.e
	x.hctx.init(parent, e.cfg.Timeout)
	if e.recoverer != nil {
		x.hctx.points = pointSaver{store: e.recoverer, inTx: inTx, bodies: e.bodies}
		x.hctx.ex.points = &x.hctx.points
	}
	return &x.hctx
}

// execute runs the handler for the key a claim acquired, in the form
// chosen in New, and answers; duplicates of the key waiting in this
// process are told when it ends.
func (x *execution) execute() {
	e := x.e
	defer e.local.Notify(x.wk)
	x.held.ref, x.held.ctx, x.held.log, x.held.patient = x.ref, &x.hctx, x.log, e.serialTx
	e.hb.hold(&x.held, x.sent, x.granted)
	defer e.hb.drop(&x.held)
	if e.txStore != nil {
		x.runInTx()
		return
	}
	x.runSeparately()
}

// run runs the face's handler with hctx and classifies what it did.
func (x *execution) run(hctx context.Context, inTx bool) {
	if x.pointErr != nil {
		x.log.LogAttrs(x.ctx, slog.LevelError, "the key's recovery point cannot be opened (are BodyKeys missing a key?): the handler was not run",
			slog.String("error", x.pointErr.Error()))
		x.ran = Ran{Status: 500, Failure: "could not open its recovery point"}
	} else {
		x.ran = x.face.Run(hctx, inTx)
	}
	ran := &x.ran
	if !ran.Keep {
		ran.Err = nil // nothing was to be kept
	}
	if inTx {
		// Nothing reached the client: what cannot be kept whole is
		// rolled back.
		if ran.Overflow && ran.Failure == "" {
			ran.Failure = tooLarge
		}
		if ran.Err != nil {
			ran.Keep = false
		}
	}
	if ran.Failure != "" {
		ran.Keep = false
		if x.hctx.failed() != nil {
			ran.Failure = "lost its lease"
		}
	}
	x.e.endPhase(x.ctx, PhaseHandler, Event{Status: x.ran.Status, Err: failureErr(x.ran.Failure)})
}

// runSeparately runs the handler outside any transaction of the store's,
// then keeps its answer (Complete) or releases the key.
func (x *execution) runSeparately() {
	e, ctx := x.e, x.ctx
	hctx := x.handlerCtx(e.beginPhase(ctx, PhaseHandler), false)
	defer hctx.stop()
	x.run(hctx, false)
	ran := &x.ran
	if ran.Keep {
		e.beginPhase(ctx, PhaseComplete)
		err := ran.Err
		if err == nil {
			ran.Answer, err = e.keptAnswer(x.ref, ran.Answer, ran.Overflow)
		} else {
			err = fmt.Errorf("the answer cannot be kept: %w", err)
		}
		if err == nil {
			dctx, dcancel := detached(ctx)
			e.markStore(ctx)
			err = e.store.Complete(dctx, x.ref, ran.Answer)
			e.storeSince(ctx, StoreComplete, err)
			dcancel()
		}
		e.endPhase(ctx, PhaseComplete, Event{Err: err})
		switch {
		case errors.Is(err, idem.ErrLeaseLost):
			x.tally(OutcomeLeaseLost)
			x.log.LogAttrs(ctx, slog.LevelWarn, "completion refused: the lease was lost while the handler ran; another execution may have run too",
				slog.Int("status", ran.Status), slog.Duration("lease", e.cfg.Lease))
		case err != nil:
			x.tally(OutcomeStoreError)
			x.log.LogAttrs(ctx, slog.LevelError, "could not keep the answer; the key stays in flight until its lease ends",
				slog.Int("status", ran.Status), slog.String("error", err.Error()))
		default:
			e.recent.Keep(x.wk, x.req.Fingerprint, &ran.Answer, x.expires)
			x.tally(OutcomeExecuted)
			x.log.LogAttrs(ctx, slog.LevelDebug, "executed", slog.Int("status", ran.Status))
		}
		// The effect has happened, kept or not: the client gets its answer.
		x.face.Send()
		return
	}
	switch {
	case hctx.ex.hasRecovery() && !ran.Crashed:
		x.unfinished()
	case ran.Crashed:
		// The handler ended like a crash: nobody knows how far its
		// effect got, and outside a shared transaction nothing undid it.
		// Releasing would let a retry run the effect again at once;
		// instead the key stays in flight until its lease ends, and the
		// retry that takes it over can find what the crashed execution
		// did (see Execution.ClaimedAt).
		x.tally(OutcomeAborted)
		x.log.LogAttrs(ctx, slog.LevelWarn, "handler aborted: the key stays in flight until its lease ends",
			slog.Duration("lease", e.cfg.Lease))
		x.face.Refuse(Refusal{Reason: RefusedHandlerFailed})
	default:
		x.release()
		x.answerUnkept(false)
	}
}

// answerUnkept answers with what a handler whose answer was not kept
// answered: its own answer, or, when it gave none, a refusal.
func (x *execution) answerUnkept(rolledBack bool) {
	if x.ran.Failure != "" {
		x.face.Refuse(Refusal{Reason: RefusedHandlerFailed, RetryAfter: time.Second, RolledBack: rolledBack})
		return
	}
	x.face.Send()
}

// unfinished answers a failure of an execution that saved a recovery point
// (or went on from one): its key is not released, since its phases may
// have done something past the database's edge; it stays in flight, its
// lease yielded, so that a retry or a Completer takes it over at once and
// goes on from the point.
func (x *execution) unfinished() {
	e, ctx := x.e, x.ctx
	x.tally(OutcomeUnfinished)
	attrs := []slog.Attr{slog.Int("status", x.ran.Status), slog.String("failure", x.ran.Failure)}
	if err := x.yield(); err != nil {
		attrs = append(attrs, slog.String("yield_error", err.Error()), slog.Duration("lease", e.cfg.Lease))
	}
	x.log.LogAttrs(ctx, slog.LevelWarn, "failed after a recovery point: the key stays in flight with its point, for a retry or the completer to go on from", attrs...)
	if x.pointErr != nil {
		x.face.Refuse(Refusal{Reason: RefusedUnreadable, Err: x.pointErr})
		return
	}
	if x.ran.Failure != "" {
		x.face.Refuse(Refusal{Reason: RefusedUnfinished, RetryAfter: time.Second})
		return
	}
	x.face.Send()
}

// yield ends the execution's lease now, keeping its key in flight with its
// recovery point. The lease is no longer renewed, and a renewal on its way
// lands first: one after the Yield would end the lease a whole lease later.
func (x *execution) yield() error {
	if x.e.recoverer == nil {
		return errors.New("the store keeps no recovery points")
	}
	x.e.hb.settle(&x.held)
	dctx, cancel := detached(x.ctx)
	defer cancel()
	return x.e.recoverer.Yield(dctx, x.ref)
}

// release gives the key up after a transient failure, so that a retry
// runs again.
func (x *execution) release() {
	e, ctx := x.e, x.ctx
	dctx, cancel := detached(ctx)
	defer cancel()
	attrs := []slog.Attr{slog.Int("status", x.ran.Status)}
	if x.ran.Failure != "" {
		attrs = append(attrs, slog.String("failure", x.ran.Failure))
	}
	e.beginPhase(ctx, PhaseComplete)
	e.markStore(ctx)
	err := e.store.Release(dctx, x.ref)
	e.storeSince(ctx, StoreRelease, err)
	e.endPhase(ctx, PhaseComplete, Event{Err: err})
	if err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			x.tally(OutcomeLeaseLost)
			x.log.LogAttrs(ctx, slog.LevelWarn, "release refused: the lease was lost while the handler ran", attrs...)
			return
		}
		if errors.Is(err, idem.ErrHasRecoveryPoint) {
			// A point this execution did not know of (saved by an earlier
			// one after its claim was read): the store keeps the key, and
			// it is yielded, as after any failure with a point.
			x.tally(OutcomeUnfinished)
			if yerr := x.yield(); yerr != nil {
				attrs = append(attrs, slog.String("yield_error", yerr.Error()))
			}
			x.log.LogAttrs(ctx, slog.LevelWarn, "failed on a key with a recovery point: it stays in flight with its point", attrs...)
			return
		}
		x.tally(OutcomeStoreError)
		x.log.LogAttrs(ctx, slog.LevelError, "could not release the key; it frees itself when its lease ends",
			append(attrs, slog.String("error", err.Error()))...)
		return
	}
	x.released()
}

// released counts and logs a key given up after a transient failure.
func (x *execution) released() {
	attrs := []slog.Attr{slog.Int("status", x.ran.Status)}
	if x.ran.Failure != "" {
		attrs = append(attrs, slog.String("failure", x.ran.Failure))
	}
	x.tally(OutcomeReleased)
	x.log.LogAttrs(x.ctx, slog.LevelInfo, "transient failure: key released so a retry runs again", attrs...)
}

// keptAnswer is what the store keeps of answer, for ref: its body sealed
// (Config.BodyKeys), or dropped when it is too large to keep (overflow) or
// Config.DiscardBodies says so.
func (e *Engine) keptAnswer(ref idem.Ref, answer idem.Response, overflow bool) (idem.Response, error) {
	kept := idem.Response{Status: answer.Status, Header: answer.Header}
	switch {
	case overflow || e.cfg.DiscardBodies || answer.BodyOmitted:
		kept.BodyOmitted = true
	case e.bodies != nil && len(answer.Body) > 0:
		sealed, err := e.bodies.seal(ref.Scope, ref.Key, answer.Body)
		if err != nil {
			return idem.Response{}, fmt.Errorf("sealing the kept body: %w", err)
		}
		kept.Body = sealed
	default:
		// The face hands the body over (see Ran.Answer): no copy.
		kept.Body = answer.Body
	}
	return kept, nil
}
