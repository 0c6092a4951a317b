package keyed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
)

// tooLarge is the failure of an answer too large to keep inside the
// store's transaction.
const tooLarge = "answered with more than the response size limit"

// work is the work of CompleteTx, and of ClaimTx once the key is claimed:
// the handler, run with txctx (which carries the transaction), and what to
// keep of it.
func (x *execution) work(txctx context.Context) (idem.Response, bool, error) {
	e, ctx := x.e, x.ctx
	x.run(txctx, true)
	e.beginPhase(ctx, PhaseComplete)
	e.markStore(ctx)
	if !x.ran.Keep {
		return idem.Response{}, false, nil
	}
	kept, err := e.keptAnswer(x.ref, x.ran.Answer, false)
	if err != nil {
		// Rolled back and released like any answer not kept; the client
		// is told it could not be kept.
		x.ran.Keep, x.ran.Err = false, err
		return idem.Response{}, false, nil
	}
	x.ran.Answer = kept
	return kept, true, nil
}

// runInTx runs the handler inside the store's CompleteTx, which keeps the
// answer as the handler's writes commit.
func (x *execution) runInTx() {
	e, ctx := x.e, x.ctx
	hctx := x.handlerCtx(e.beginPhase(ctx, PhaseHandler), true)
	defer hctx.stop()
	e.markStore(ctx)
	kept, err := e.txStore.CompleteTx(hctx, x.ref, x.work)
	x.finishTx(kept, err, false)
}

// claimInTx claims the key in the transaction the handler runs in
// (TxClaimer.ClaimTx). A duplicate of a key this process is executing waits
// at the key's gate rather than in the store, holding none of its
// connections; one with another fingerprint is refused at once, as a claim
// that saw the key in flight would refuse it. answered says that it
// answered the request itself: the claim acquired the key and the handler
// ran, or the gate refused the request. Otherwise the caller answers by
// the claim's outcome, or by err.
func (x *execution) claimInTx() (claim idem.Claim, answered bool, err error) {
	c, e := &x.call, x.e
	for {
		ended, fp, done := e.gates.Executing(c.wk)
		if ended == nil {
			break
		}
		if fp != c.req.Fingerprint {
			done()
			c.refuseMismatch(idem.StateInFlight)
			return idem.Claim{}, true, nil
		}
		ok := c.waitGate(ended)
		done()
		if !ok {
			c.inFlightTooLong(time.Time{})
			return idem.Claim{}, true, nil
		}
	}
	var endGate func()
	defer func() {
		if endGate != nil {
			endGate() // after the commit or rollback, also when the handler aborts
		}
		if x.hctx.parent != nil {
			x.hctx.stop()
		}
	}()
	e.markStore(c.ctx)
	// The transaction outlives the caller: an answer the caller did not
	// wait for is kept for its retry.
	claim, kept, err := e.txClaimer.ClaimTx(context.WithoutCancel(c.ctx), c.req, max(time.Until(c.deadline), time.Millisecond),
		func(txctx context.Context, cl idem.Claim) (idem.Response, bool, error) {
			// Once the key is ours, before the handler runs, stop watching.
			x.watch.stop()
			e.storeSince(c.ctx, StoreClaim, nil)
			e.endPhase(c.ctx, PhaseClaim, Event{Claim: ClaimAcquired, TookOver: cl.TookOver})
			endGate = e.gates.Begin(c.wk, c.req.Fingerprint)
			x.acquired(cl)
			x.handlerCtx(e.beginPhase(txctx, PhaseHandler), true)
			return x.work(&x.hctx)
		})
	if claim.Outcome != idem.Acquired {
		e.storeSince(c.ctx, StoreClaim, err)
		return claim, false, err
	}
	if x.hctx.parent == nil {
		// Acquired, yet the work never ran: the store failed in between.
		x.acquired(claim)
	}
	defer e.local.Notify(c.wk)
	// Not kept, the claim was rolled back with everything else: the key is
	// as it was, and is not released.
	x.finishTx(kept, err, true)
	return claim, true, nil
}

// finishTx answers after the handler ran in a store's transaction.
// rolledBack says that a rollback leaves the key as it was before the
// claim (ClaimTx), with nothing to release.
func (x *execution) finishTx(kept bool, err error, rolledBack bool) {
	e, ctx := x.e, x.ctx
	ran := &x.ran
	e.endPhase(ctx, PhaseHandler, Event{Err: err}) // when the transaction failed before the handler ran
	e.storeSince(ctx, StoreComplete, err)
	if err != nil || kept || rolledBack {
		// Otherwise the release or yield below ends it.
		e.endPhase(ctx, PhaseComplete, Event{Err: err})
	}
	switch {
	case err == nil && kept:
		e.recent.Keep(x.wk, x.req.Fingerprint, &ran.Answer, x.expires)
		x.tally(OutcomeExecuted)
		x.log.LogAttrs(ctx, slog.LevelDebug, "executed", slog.Int("status", ran.Status))
		x.face.Send()
		return
	case err == nil:
		x.notKeptTx(rolledBack)
		return
	case errors.Is(err, idem.ErrLeaseLost):
		x.tally(OutcomeLeaseLost)
		x.log.LogAttrs(ctx, slog.LevelWarn, "completion refused: the lease was lost while the handler ran; its effect was rolled back",
			slog.Int("status", ran.Status), slog.Duration("lease", e.cfg.Lease))
		x.face.Refuse(Refusal{Reason: RefusedLeaseLost, RetryAfter: time.Second, Err: err})
		return
	}
	x.afterAmbiguousCommit(err)
}

// notKeptTx settles a key whose transaction was rolled back (the answer
// not kept, or the handler failed), and answers.
func (x *execution) notKeptTx(rolledBack bool) {
	ran := &x.ran
	switch {
	case x.hctx.ex.hasRecovery():
		// An earlier execution saved a point (this one cannot, in the
		// store's transaction): whatever it did past the database's edge
		// is not undone by this rollback, so the key keeps its point and
		// is never released. A rolled-back claim left it as it was, in
		// flight under a lease that had ended; otherwise the lease is
		// yielded.
		x.tally(OutcomeUnfinished)
		attrs := []slog.Attr{slog.Int("status", ran.Status), slog.String("failure", ran.Failure)}
		if !rolledBack {
			if err := x.yield(); err != nil {
				attrs = append(attrs, slog.String("yield_error", err.Error()), slog.Duration("lease", x.e.cfg.Lease))
			}
		}
		x.e.endPhase(x.ctx, PhaseComplete, Event{})
		x.log.LogAttrs(x.ctx, slog.LevelWarn, "failed after a recovery point: the key stays in flight with its point, for a retry or the completer to go on from", attrs...)
	case rolledBack:
		x.released()
	default:
		x.release()
	}
	switch {
	case x.pointErr != nil:
		x.face.Refuse(Refusal{Reason: RefusedUnreadable, Err: x.pointErr})
	case ran.Overflow && ran.Failure == tooLarge:
		x.face.Refuse(Refusal{Reason: RefusedTooLarge})
	case ran.Err != nil:
		x.log.LogAttrs(x.ctx, slog.LevelError, "answer cannot be kept: request rolled back", slog.String("error", ran.Err.Error()))
		x.face.Refuse(Refusal{Reason: RefusedUnkeepable, Err: ran.Err})
	case x.hctx.ex.hasRecovery() && ran.Failure != "":
		x.face.Refuse(Refusal{Reason: RefusedUnfinished, RetryAfter: time.Second})
	default:
		x.answerUnkept(true)
	}
}

// afterAmbiguousCommit handles a CompleteTx error that is neither the
// handler's nor a fencing refusal: the commit may or may not have happened.
// The store is asked which; only a key that is provably not completed by
// this execution is released (and never one with a recovery point).
func (x *execution) afterAmbiguousCommit(cerr error) {
	e, ctx := x.e, x.ctx
	dctx, cancel := detached(ctx)
	defer cancel()
	e.markStore(ctx)
	record, gerr := e.store.Get(dctx, x.ref.Scope, x.ref.Key)
	e.storeSince(ctx, StoreGet, gerr)
	if gerr == nil && record.State == idem.StateCompleted && record.Token == x.ref.Token {
		x.tally(OutcomeExecuted)
		x.log.LogAttrs(ctx, slog.LevelWarn, "commit reported an error but did commit", slog.String("error", cerr.Error()))
		x.face.Send()
		return
	}
	// The execution's lease could not be kept, and its context, which the
	// transaction ran under, was cancelled: the transaction rolled back
	// (Get says it did not commit).
	lost := x.hctx.failed()
	if lost != nil {
		x.tally(OutcomeLeaseLost)
	} else {
		x.tally(OutcomeStoreError)
	}
	if gerr == nil && record.State == idem.StateInFlight && record.Token == x.ref.Token {
		var rerr error
		if x.hctx.ex.hasRecovery() {
			rerr = x.yield()
		} else {
			e.markStore(ctx)
			rerr = e.store.Release(dctx, x.ref)
			e.storeSince(ctx, StoreRelease, rerr)
		}
		if rerr != nil && !errors.Is(rerr, idem.ErrLeaseLost) {
			x.log.LogAttrs(ctx, slog.LevelError, "could not release the key; it frees itself when its lease ends", slog.String("error", rerr.Error()))
		}
	}
	if lost != nil {
		x.log.LogAttrs(ctx, slog.LevelWarn, "the lease could not be kept while the handler ran; its effect was rolled back",
			slog.String("error", cerr.Error()), slog.String("cause", lost.Error()))
		x.face.Refuse(Refusal{Reason: RefusedLeaseLost, RetryAfter: time.Second, Err: lost})
		return
	}
	x.log.LogAttrs(ctx, slog.LevelError, "commit failed; nothing was kept", slog.String("error", cerr.Error()))
	x.face.Refuse(Refusal{Reason: RefusedCommitFailed, RetryAfter: time.Second, Err: fmt.Errorf("commit: %w", cerr)})
}
