package idemhttp

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/idem-go/idem"
)

// answerFromRecord answers a duplicate of a key seen completed lately from
// the key's record, read without claiming it, and reports whether it did:
// a record that is completed is replayed, one with another fingerprint
// refused. Anything else (the key gone, in flight again after it expired,
// the store failing) is left to the claim.
func (m *Middleware) answerFromRecord(ctx context.Context, w http.ResponseWriter, req idem.ClaimRequest, log reqLog) bool {
	// Ended here with no status when the claim is left to answer.
	defer m.endPhase(ctx, PhaseReplay, Event{})
	m.beginPhase(ctx, PhaseReplay)
	m.markStore(ctx)
	if m.replayer != nil {
		resp, mismatch, err := m.replayer.Replay(ctx, req.Scope, req.Key, req.Fingerprint)
		m.storeSince(ctx, StoreReplay, err)
		switch {
		case err != nil:
			return false
		case mismatch:
			m.refuseMismatch(ctx, w, log, idem.StateCompleted)
			return true
		case resp == nil:
			return false
		}
		m.replayKept(ctx, w, log, resp)
		return true
	}
	rec, err := m.store.Get(ctx, req.Scope, req.Key)
	m.storeSince(ctx, StoreGet, err)
	switch {
	case err != nil:
		return false
	case rec.Fingerprint != req.Fingerprint:
		m.refuseMismatch(ctx, w, log, rec.State)
		return true
	case rec.State != idem.StateCompleted || rec.Response == nil:
		return false
	}
	m.recent.Keep(waitKey{Scope: req.Scope, Key: req.Key}, rec.Fingerprint, rec.Response, rec.ExpiresAt)
	m.replayKept(ctx, w, log, rec.Response)
	return true
}

// replayKept answers a duplicate with the key's kept answer.
func (m *Middleware) replayKept(ctx context.Context, w http.ResponseWriter, log reqLog, resp *idem.Response) {
	m.beginPhase(ctx, PhaseReplay)
	defer m.endReplay(ctx, resp)
	if resp != nil && len(resp.Body) > 0 {
		body, sealed, err := m.bodies.open(log.scope, log.key, resp.Body)
		if err != nil {
			// The effect happened and its answer is kept: running again
			// would repeat it, so the duplicate is refused instead, until
			// an operator restores the key that opens it.
			m.tally(ctx, OutcomeStoreError)
			log.LogAttrs(ctx, slog.LevelError, "kept answer unreadable: duplicate refused", slog.String("error", err.Error()))
			(&Problem{Type: ProblemAnswerUnreadable, Title: "Kept answer unreadable", Status: http.StatusInternalServerError,
				Detail: "The request ran before, but its kept answer cannot be read; it is not run again."}).Write(w)
			return
		}
		if sealed {
			opened := *resp
			opened.Body = body
			resp = &opened
		}
	}
	m.tally(ctx, OutcomeReplayed)
	log.LogAttrs(ctx, slog.LevelDebug, "idempotent replay", slog.Int("status", resp.Status))
	writeReplay(w, resp)
}

// refuseMismatch answers a request whose key was used for another one,
// the key being in state.
func (m *Middleware) refuseMismatch(ctx context.Context, w http.ResponseWriter, log reqLog, state idem.State) {
	m.tally(ctx, OutcomeMismatch)
	m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimMismatch})
	m.endPhase(ctx, PhaseReplay, Event{Status: http.StatusUnprocessableEntity})
	log.LogAttrs(ctx, slog.LevelInfo, "idempotency key reused with a different request", slog.String("state", state.String()))
	(&Problem{Type: ProblemKeyMismatch, Title: "Idempotency key reused", Status: http.StatusUnprocessableEntity,
		Detail: "This Idempotency-Key was already used with a different request (method, path, query or body). Use a new key for a new operation."}).Write(w)
}

func writeReplay(w http.ResponseWriter, resp *idem.Response) {
	if resp == nil {
		resp = &idem.Response{Status: http.StatusOK}
	}
	h := w.Header()
	for k, v := range resp.Header {
		if !neverReplayed[http.CanonicalHeaderKey(k)] {
			h[k] = append([]string(nil), v...)
		}
	}
	h.Set(HeaderReplayed, "true")
	if resp.BodyOmitted {
		h.Set(HeaderBodyOmitted, "true")
		h.Del("Content-Type")
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}
