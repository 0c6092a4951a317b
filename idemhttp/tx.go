package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-go/idem"
)

// txRun is one run of the handler inside a store's transaction.
type txRun struct {
	rec     *recorder
	failure string
	abort   bool
	// of and kept are what the run completed with, for memory.
	of   answerOf
	kept idem.Response
}

// runTx runs the handler with hctx, the context that carries the
// transaction, and says what to keep.
func (m *Middleware) runTx(next http.Handler, r *http.Request, run *txRun, hctx context.Context) (idem.Response, bool, error) {
	rec := run.rec
	run.failure, run.abort = runHandler(next, rec, r.WithContext(hctx))
	if run.failure == "" && !rec.wroteAny && hctx.Err() != nil {
		run.failure = "timed out"
	}
	if run.failure == "" && rec.overflow {
		run.failure = "answered with more than the response size limit"
	}
	m.endPhase(r.Context(), PhaseHandler, Event{Status: rec.statusCode(), Err: failureErr(run.failure)})
	m.beginPhase(r.Context(), PhaseComplete)
	m.markStore(r.Context())
	if run.failure != "" || !m.cfg.Keep(r, rec.statusCode()) {
		return idem.Response{}, false, nil
	}
	// The record's scope and key bind a sealed body to it; they are read
	// only to seal, as the context lookup costs an allocation.
	var scope idem.Scope
	var key idem.Key
	if m.bodies != nil {
		ex, _ := ExecutionFromContext(hctx)
		scope, key = ex.Scope, ex.Key
	}
	kept, err := m.keptResponse(rec, scope, key)
	if err != nil {
		return idem.Response{}, false, err
	}
	run.kept = kept
	return kept, true, nil
}

// runInTx runs the handler inside the store's CompleteTx, which keeps the
// answer as the handler's writes commit.
func (m *Middleware) runInTx(next http.Handler, w http.ResponseWriter, r *http.Request, hctx *execCtx, ref idem.Ref, of answerOf, log reqLog) {
	m.markStore(r.Context())
	run := &txRun{rec: newRecorder(w, m.cfg.MaxResponseBytes, false), of: of}
	kept, err := m.txStore.CompleteTx(hctx, ref, func(txctx context.Context) (idem.Response, bool, error) {
		return m.runTx(next, r, run, txctx)
	})
	m.finishTx(w, r, ref, run, kept, err, false, log)
}

// claimInTx claims the key in the transaction the handler runs in
// (TxClaimer.ClaimTx). A duplicate of a key this process is executing waits
// at the key's gate rather than in the store, holding none of its
// connections; one with another fingerprint is refused at once, as a claim
// that saw the key in flight would refuse it.
func (m *Middleware) claimInTx(next http.Handler, w http.ResponseWriter, r *http.Request, req idem.ClaimRequest,
	deadline time.Time, log reqLog, watch *keyWatch) (idem.Claim, bool, error) {
	ctx := r.Context()
	wk := waitKey{Scope: req.Scope, Key: req.Key}
	for {
		ended, fp, done := m.gates.Executing(wk)
		if ended == nil {
			break
		}
		if fp != req.Fingerprint {
			done()
			m.refuseMismatch(ctx, w, log, idem.StateInFlight)
			return idem.Claim{}, true, nil
		}
		ok := m.waitGate(ctx, ended, deadline)
		done()
		if !ok {
			m.inFlightTooLong(ctx, w, log)
			return idem.Claim{}, true, nil
		}
	}
	// Once the key is ours, before the handler runs (it may end in a
	// panic), stop watching.
	return m.claimTx(next, w, r, req, deadline, log, watch.stop)
}

// claimTx claims the key with the store's ClaimTx and, when it acquires
// it, calls acquired, holds this process's duplicates of the key at its
// gate, runs the handler in the claim's transaction and answers (ran).
// When the claim does not acquire the key, or fails, the caller answers as
// it answers a Claim.
func (m *Middleware) claimTx(next http.Handler, w http.ResponseWriter, r *http.Request, req idem.ClaimRequest, deadline time.Time, log reqLog, acquired func()) (claim idem.Claim, ran bool, err error) {
	run := &txRun{rec: newRecorder(w, m.cfg.MaxResponseBytes, false), of: answerOf{fp: req.Fingerprint}}
	var hctx *execCtx
	endGate := func() {}
	defer func() {
		endGate() // after the commit or rollback, also when the handler aborts
		if hctx != nil {
			hctx.stop()
		}
	}()
	m.markStore(r.Context())
	claim, kept, err := m.txClaimer.ClaimTx(r.Context(), req, time.Until(deadline), func(txctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		acquired()
		run.of.expires = c.Record.ExpiresAt
		m.storeSince(r.Context(), StoreClaim, nil)
		m.endPhase(r.Context(), PhaseClaim, Event{Claim: ClaimAcquired, TookOver: c.TookOver})
		endGate = m.gates.Begin(waitKey{Scope: req.Scope, Key: req.Key}, req.Fingerprint)
		if c.TookOver {
			log.LogAttrs(r.Context(), slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(c.Token)))
		}
		hctx = m.handlerCtx(m.beginPhase(txctx, PhaseHandler), Execution{Scope: req.Scope, Key: req.Key, Token: c.Token, ClaimedAt: c.Record.CreatedAt, TookOver: c.TookOver,
			Recovery: c.Record.Recovery}, true)
		return m.runTx(next, r, run, hctx)
	})
	if claim.Outcome != idem.Acquired {
		m.storeSince(r.Context(), StoreClaim, err)
		return claim, false, err
	}
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	defer m.local.Notify(waitKey{Scope: ref.Scope, Key: ref.Key})
	// A fresh claim that is not kept was rolled back with everything else;
	// a key taken over must still be released.
	m.finishTx(w, r, ref, run, kept, err, !claim.TookOver, log)
	return claim, true, nil
}

// finishTx answers after the handler ran in a store's transaction. rolledBack
// says that a rollback leaves the key free, with nothing to release.
func (m *Middleware) finishTx(w http.ResponseWriter, r *http.Request, ref idem.Ref, run *txRun, kept bool, err error, rolledBack bool, log reqLog) {
	rec, failure, abort := run.rec, run.failure, run.abort
	status := rec.statusCode()
	m.endPhase(r.Context(), PhaseHandler, Event{Err: err}) // when the transaction failed before the handler ran
	m.storeSince(r.Context(), StoreComplete, err)
	if err != nil || kept || rolledBack {
		// Otherwise the release below ends it.
		m.endPhase(r.Context(), PhaseComplete, Event{Err: err})
	}
	switch {
	case err == nil && kept:
		m.recent.Keep(waitKey{Scope: ref.Scope, Key: ref.Key}, run.of.fp, &run.kept, run.of.expires)
		m.tally(r.Context(), OutcomeExecuted)
		log.LogAttrs(r.Context(), slog.LevelDebug, "executed", slog.Int("status", status))
		rec.send(nil)
	case err == nil:
		if rolledBack {
			m.released(r.Context(), log, status, failure)
		} else {
			m.release(r.Context(), ref, log, status, failure)
		}
		switch {
		case abort:
			panic(http.ErrAbortHandler)
		case rec.overflow && failure != "":
			(&Problem{Type: ProblemResponseTooLarge, Title: "Response too large to keep", Status: http.StatusInternalServerError,
				Detail: fmt.Sprintf("The answer exceeded %d bytes, the most that is kept for replay, so the request was rolled back.", m.cfg.MaxResponseBytes)}).Write(w)
		case failure != "":
			(&Problem{Type: ProblemHandlerFailed, Title: "Request failed", Status: http.StatusInternalServerError,
				Detail: "The request " + failure + " and was rolled back. Retry with the same key.", RetryAfter: 1}).Write(w)
		default:
			rec.send(nil)
		}
	case errors.Is(err, idem.ErrLeaseLost):
		m.tally(r.Context(), OutcomeLeaseLost)
		log.LogAttrs(r.Context(), slog.LevelWarn, "completion refused: the lease was lost while the handler ran; its effect was rolled back",
			slog.Int("status", status), slog.Duration("lease", m.cfg.Lease))
		(&Problem{Type: ProblemLeaseLost, Title: "Request superseded", Status: http.StatusServiceUnavailable,
			Detail: "This execution took longer than its lease and another took over the key; its effect was rolled back. Retry with the same key to get the result.", RetryAfter: 1}).Write(w)
	default:
		m.afterAmbiguousCommit(w, r, ref, rec, err, log)
	}
}

// afterAmbiguousCommit handles a CompleteTx error that is neither the
// handler's nor a fencing refusal: the commit may or may not have happened.
// The store is asked which; only a key that is provably not completed by
// this execution is released.
func (m *Middleware) afterAmbiguousCommit(w http.ResponseWriter, r *http.Request, ref idem.Ref, rec *recorder, cerr error, log reqLog) {
	dctx, cancel := detached(r.Context())
	defer cancel()
	record, gerr := m.store.Get(dctx, ref.Scope, ref.Key)
	if gerr == nil && record.State == idem.StateCompleted && record.Token == ref.Token {
		m.tally(r.Context(), OutcomeExecuted)
		log.LogAttrs(r.Context(), slog.LevelWarn, "commit reported an error but did commit", slog.String("error", cerr.Error()))
		rec.send(nil)
		return
	}
	m.tally(r.Context(), OutcomeStoreError)
	if gerr == nil && record.State == idem.StateInFlight && record.Token == ref.Token {
		if rerr := m.store.Release(dctx, ref); rerr != nil && !errors.Is(rerr, idem.ErrLeaseLost) {
			log.LogAttrs(r.Context(), slog.LevelError, "could not release the key; it frees itself when its lease ends", slog.String("error", rerr.Error()))
		}
	}
	log.LogAttrs(r.Context(), slog.LevelError, "commit failed; nothing was kept", slog.String("error", cerr.Error()))
	(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
		Detail: "The request could not be committed and was rolled back. Retry with the same key.", RetryAfter: 1}).Write(w)
}
