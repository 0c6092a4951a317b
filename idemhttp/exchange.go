package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// exchange is one protected request as the engine's face (keyed.Face): the
// request, its writer, and what its handler wrote. One allocation holds it
// all, the body handed to the handler and the recorder included.
type exchange struct {
	m    *Middleware
	next http.Handler
	w    http.ResponseWriter
	r    *http.Request
	body bodyReader
	rec  recorder
	// failure and abort are what the handler's run came to (keyed.Ran's
	// Failure and Crashed).
	failure string
	abort   bool
}

// Run implements keyed.Face: it runs the handler into the recorder, which
// may stream a long answer to the client outside the store's transaction.
func (x *exchange) Run(ctx context.Context, inTx bool) keyed.Ran {
	m, rec := x.m, &x.rec
	rec.init(x.w, m.cfg.MaxResponseBytes, !inTx)
	failure, abort := runHandler(x.next, rec, x.r.WithContext(ctx))
	status := rec.statusCode()
	if failure == "" && !rec.wroteAny && ctx.Err() != nil {
		failure = "timed out"
	}
	x.failure, x.abort = failure, abort
	ran := keyed.Ran{Status: status, Failure: failure, Crashed: abort, Overflow: rec.overflow}
	if failure == "" && m.cfg.Keep(x.r, status) {
		ran.Keep, ran.Answer = true, m.keptResponse(rec)
	}
	return ran
}

// Send implements keyed.Face: the handler's own answer.
func (x *exchange) Send() { x.rec.send(nil) }

// Replay implements keyed.Face.
func (x *exchange) Replay(resp *idem.Response) error {
	writeReplay(x.w, resp)
	return nil
}

// Refuse implements keyed.Face: each refusal as a problem+json answer.
func (x *exchange) Refuse(rf keyed.Refusal) {
	w := x.w
	retry := retryAfterSeconds(rf.RetryAfter)
	switch rf.Reason {
	case keyed.RefusedMismatch:
		(&Problem{Type: ProblemKeyMismatch, Title: "Idempotency key reused", Status: http.StatusUnprocessableEntity,
			Detail: "This Idempotency-Key was already used with a different request (method, path, query or body). Use a new key for a new operation."}).Write(w)
	case keyed.RefusedInFlight:
		if x.r.Context().Err() != nil {
			return // the client has gone; nobody reads an answer
		}
		(&Problem{Type: ProblemInFlight, Title: "Request in flight", Status: http.StatusConflict,
			Detail: "A request with this Idempotency-Key is still being processed. Retry later with the same key to get its result.", RetryAfter: retry}).Write(w)
	case keyed.RefusedStoreUnavailable:
		(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was not run, because its idempotency key could not be claimed. Retry with the same key.", RetryAfter: retry}).Write(w)
	case keyed.RefusedCommitFailed:
		(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request could not be committed and was rolled back. Retry with the same key.", RetryAfter: retry}).Write(w)
	case keyed.RefusedLeaseLost:
		(&Problem{Type: ProblemLeaseLost, Title: "Request superseded", Status: http.StatusServiceUnavailable,
			Detail: "This execution took longer than its lease and another took over the key; its effect was rolled back. Retry with the same key to get the result.", RetryAfter: retry}).Write(w)
	case keyed.RefusedHandlerFailed:
		if x.abort || x.rec.streaming {
			return // the connection is cut, or the client has part of an answer
		}
		ended := "was not completed"
		if rf.RolledBack {
			ended = "was rolled back"
		}
		(&Problem{Type: ProblemHandlerFailed, Title: "Request failed", Status: http.StatusInternalServerError,
			Detail: "The request " + x.failure + " and " + ended + ". Retry with the same key.", RetryAfter: retry}).Write(w)
	case keyed.RefusedUnfinished:
		if x.abort || x.rec.streaming {
			return
		}
		(&Problem{Type: ProblemHandlerFailed, Title: "Request unfinished", Status: http.StatusServiceUnavailable,
			Detail: "The request " + x.failure + " part-way and will be finished. Retry with the same key to get its result.", RetryAfter: retry}).Write(w)
	case keyed.RefusedTooLarge:
		(&Problem{Type: ProblemResponseTooLarge, Title: "Response too large to keep", Status: http.StatusInternalServerError,
			Detail: fmt.Sprintf("The answer exceeded %d bytes, the most that is kept for replay, so the request was rolled back.", x.m.cfg.MaxResponseBytes)}).Write(w)
	case keyed.RefusedUnkeepable:
		(&Problem{Type: ProblemHandlerFailed, Title: "Request failed", Status: http.StatusInternalServerError,
			Detail: "The answer could not be kept, so the request was rolled back. Retry with the same key.", RetryAfter: retry}).Write(w)
	case keyed.RefusedUnreadable:
		(&Problem{Type: ProblemAnswerUnreadable, Title: "Kept answer unreadable", Status: http.StatusInternalServerError,
			Detail: "The request ran before, but its kept answer cannot be read; it is not run again."}).Write(w)
	default:
		(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was not run. Retry with the same key.", RetryAfter: retry}).Write(w)
	}
}

// retryAfterSeconds is d as Retry-After's whole seconds, rounded up: a
// client told to retry in 0 seconds would retry at once.
func retryAfterSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// runHandler runs next and turns a panic into a failure description. abort
// reports http.ErrAbortHandler, which the middleware raises again once the
// engine has settled the key, so that the connection is cut as the handler
// intended.
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

// keptResponse is what the engine keeps of rec: status, allow-listed
// headers and the body (which rec no longer changes).
func (m *Middleware) keptResponse(rec *recorder) idem.Response {
	h := make(http.Header, len(m.replay))
	src := rec.header
	if rec.streaming {
		src = rec.w.Header()
	}
	for _, name := range m.replay {
		if v := src.Values(name); len(v) > 0 {
			h[name] = append([]string(nil), v...)
		}
	}
	return idem.Response{Status: rec.statusCode(), Header: h, Body: rec.buf.Bytes()}
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
