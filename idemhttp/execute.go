package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-go/idem"
)

// answerOf is what the middleware keeps in memory of a completion, beside
// the answer (see Config.MemoryReplayFor): the request's fingerprint and
// when its record expires.
type answerOf struct {
	fp      idem.Fingerprint
	expires time.Time
}

// execute runs the handler for the key a claim acquired, in the form chosen
// in New, and answers; duplicates of the key waiting in this process are
// told when it ends.
func (m *Middleware) execute(next http.Handler, w http.ResponseWriter, r *http.Request, ex Execution, of answerOf, log reqLog) {
	ref := idem.Ref{Scope: ex.Scope, Key: ex.Key, Token: ex.Token}
	defer m.local.Notify(waitKey{Scope: ref.Scope, Key: ref.Key})
	hctx := m.handlerCtx(m.beginPhase(r.Context(), PhaseHandler), ex, m.txStore != nil)
	defer hctx.stop()
	m.run(next, w, r, hctx, ref, of, log)
}

// runSeparately runs the handler outside any transaction of the store's,
// then keeps its answer (Complete) or releases the key.
func (m *Middleware) runSeparately(next http.Handler, w http.ResponseWriter, r *http.Request, hctx *execCtx, ref idem.Ref, of answerOf, log reqLog) {
	rec := newRecorder(w, m.cfg.MaxResponseBytes, true)
	failure, abort := runHandler(next, rec, r.WithContext(hctx))
	status := rec.statusCode()
	if failure == "" && !rec.wroteAny && hctx.Err() != nil {
		failure = "timed out"
	}
	m.endPhase(r.Context(), PhaseHandler, Event{Status: status, Err: failureErr(failure)})
	if failure == "" && m.cfg.Keep(r, status) {
		m.beginPhase(r.Context(), PhaseComplete)
		dctx, dcancel := detached(r.Context())
		kept, err := m.keptResponse(rec, ref.Scope, ref.Key)
		if err == nil {
			m.markStore(r.Context())
			err = m.store.Complete(dctx, ref, kept)
			m.storeSince(r.Context(), StoreComplete, err)
		}
		dcancel()
		m.endPhase(r.Context(), PhaseComplete, Event{Err: err})
		switch {
		case errors.Is(err, idem.ErrLeaseLost):
			m.tally(r.Context(), OutcomeLeaseLost)
			log.LogAttrs(r.Context(), slog.LevelWarn, "completion refused: the lease was lost while the handler ran; another execution may have run too",
				slog.Int("status", status), slog.Duration("lease", m.cfg.Lease))
		case err != nil:
			m.tally(r.Context(), OutcomeStoreError)
			log.LogAttrs(r.Context(), slog.LevelError, "could not store the answer; the key stays in flight until its lease ends",
				slog.Int("status", status), slog.String("error", err.Error()))
		default:
			m.recent.Keep(waitKey{Scope: ref.Scope, Key: ref.Key}, of.fp, &kept, of.expires)
			m.tally(r.Context(), OutcomeExecuted)
			log.LogAttrs(r.Context(), slog.LevelDebug, "executed", slog.Int("status", status))
		}
		rec.send(nil)
		return
	}
	if hctx.ex.hasRecovery() && !abort {
		m.unfinished(r.Context(), w, ref, hctx.ex.points, rec, failure, log)
		return
	}
	if abort {
		// The handler cut the connection (http.ErrAbortHandler): like a
		// crash, nobody knows how far its effect got, and outside a shared
		// transaction nothing undid it. Releasing would let a retry run the
		// effect again at once; instead the key stays in flight until its
		// lease ends, and the retry that takes it over can find what the
		// aborted execution did (see Execution.ClaimedAt).
		m.tally(r.Context(), OutcomeAborted)
		log.LogAttrs(r.Context(), slog.LevelWarn, "handler aborted: the key stays in flight until its lease ends",
			slog.Duration("lease", m.cfg.Lease))
		panic(http.ErrAbortHandler)
	}
	m.release(r.Context(), ref, log, status, failure)
	if failure != "" && !rec.streaming {
		(&Problem{Type: ProblemHandlerFailed, Title: "Request failed", Status: http.StatusInternalServerError,
			Detail: "The request " + failure + " and was not completed. Retry with the same key.", RetryAfter: 1}).Write(w)
		return
	}
	rec.send(nil)
}

// unfinished answers a failure of an execution that saved a recovery point
// (or went on from one): its key is not released, since its phases may
// have done something past the database's edge; it stays in flight until
// its lease ends, and then a retry or a Completer takes it over and goes
// on from the point.
func (m *Middleware) unfinished(ctx context.Context, w http.ResponseWriter, ref idem.Ref, points *pointSaver, rec *recorder, failure string, log reqLog) {
	m.tally(ctx, OutcomeUnfinished)
	// The execution is over: its lease ends now, so that the client's
	// retry (or a Completer) takes the key over at once and goes on from
	// the point, rather than after the lease.
	dctx, cancel := detached(ctx)
	err := points.store.Yield(dctx, ref)
	cancel()
	attrs := []slog.Attr{slog.Int("status", rec.statusCode()), slog.String("failure", failure)}
	if err != nil {
		attrs = append(attrs, slog.String("yield_error", err.Error()), slog.Duration("lease", m.cfg.Lease))
	}
	log.LogAttrs(ctx, slog.LevelWarn, "failed after a recovery point: the key stays in flight with its point, for a retry or the completer to go on from", attrs...)
	if failure != "" && !rec.streaming {
		(&Problem{Type: ProblemHandlerFailed, Title: "Request unfinished", Status: http.StatusServiceUnavailable,
			Detail: "The request " + failure + " part-way and will be finished. Retry with the same key to get its result.", RetryAfter: 1}).Write(w)
		return
	}
	rec.send(nil)
}

func (m *Middleware) release(ctx context.Context, ref idem.Ref, log reqLog, status int, failure string) {
	dctx, cancel := detached(ctx)
	defer cancel()
	attrs := []slog.Attr{slog.Int("status", status)}
	if failure != "" {
		attrs = append(attrs, slog.String("failure", failure))
	}
	m.beginPhase(ctx, PhaseComplete)
	m.markStore(ctx)
	err := m.store.Release(dctx, ref)
	m.storeSince(ctx, StoreRelease, err)
	m.endPhase(ctx, PhaseComplete, Event{Err: err})
	if err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			m.tally(ctx, OutcomeLeaseLost)
			log.LogAttrs(ctx, slog.LevelWarn, "release refused: the lease was lost while the handler ran", attrs...)
			return
		}
		m.tally(ctx, OutcomeStoreError)
		log.LogAttrs(ctx, slog.LevelError, "could not release the key; it frees itself when its lease ends",
			append(attrs, slog.String("error", err.Error()))...)
		return
	}
	m.released(ctx, log, status, failure)
}

// released counts and logs a key given up after a transient failure.
func (m *Middleware) released(ctx context.Context, log reqLog, status int, failure string) {
	attrs := []slog.Attr{slog.Int("status", status)}
	if failure != "" {
		attrs = append(attrs, slog.String("failure", failure))
	}
	m.tally(ctx, OutcomeReleased)
	log.LogAttrs(ctx, slog.LevelInfo, "transient failure: key released so a retry runs again", attrs...)
}

// runHandler runs next and turns a panic into a failure description. abort
// reports http.ErrAbortHandler, which the caller re-raises after releasing
// the key so the connection is cut as the handler intended.
func runHandler(next http.Handler, w http.ResponseWriter, r *http.Request) (failure string, abort bool) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				failure, abort = "was aborted", true
				return
			}
			failure = "panicked"
		}
	}()
	next.ServeHTTP(w, r)
	return "", false
}

// keptResponse is what the store keeps of rec: status, allow-listed headers
// and the body, or no body when it was too large.
func (m *Middleware) keptResponse(rec *recorder, scope idem.Scope, key idem.Key) (idem.Response, error) {
	h := make(http.Header)
	src := rec.header
	if rec.streaming {
		src = rec.w.Header()
	}
	for _, name := range m.replay {
		if v := src.Values(name); len(v) > 0 {
			h[name] = append([]string(nil), v...)
		}
	}
	resp := idem.Response{Status: rec.statusCode(), Header: h}
	switch {
	case rec.overflow || m.cfg.DiscardBodies:
		resp.BodyOmitted = true
	case m.bodies != nil && rec.buf.Len() > 0:
		sealed, err := m.bodies.seal(scope, key, rec.buf.Bytes())
		if err != nil {
			return idem.Response{}, fmt.Errorf("sealing the kept body: %w", err)
		}
		resp.Body = sealed
	default:
		resp.Body = bytes.Clone(rec.buf.Bytes())
	}
	return resp, nil
}
