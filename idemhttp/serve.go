package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 {
		if m.cfg.Optional {
			next.ServeHTTP(w, r)
			return
		}
		m.reject(r.Context(), w, http.StatusBadRequest, ProblemKeyMissing, "Idempotency key missing",
			"This request must carry an Idempotency-Key header: a unique value (a UUID, say) per intended operation, reused only to retry it.")
		return
	}
	if len(values) > 1 {
		m.reject(r.Context(), w, http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key",
			"Send exactly one Idempotency-Key header.")
		return
	}
	key, err := idem.ParseKey(values[0])
	if err != nil {
		var ke *idem.KeyError
		detail := err.Error()
		if errors.As(err, &ke) {
			detail = "The Idempotency-Key header is " + ke.Reason + "; it must be 1 to 255 visible ASCII characters, bare or as a quoted string."
		}
		m.reject(r.Context(), w, http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key", detail)
		return
	}
	var scope idem.Scope
	if m.cfg.Scope != nil {
		if scope, err = m.cfg.Scope(r); err != nil {
			m.rejectScope(w, r, key, err)
			return
		}
	}
	if m.keys != nil {
		key = m.keys.seal(scope, key)
	}
	log := reqLog{l: m.log, scope: scope, key: key, method: r.Method, path: r.URL.Path}
	m.noteKey(r.Context(), scope, key)
	body, tooLarge, err := readBody(r, m.cfg.MaxBodyBytes)
	switch {
	case tooLarge:
		m.reject(r.Context(), w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxBodyBytes))
		return
	case err != nil:
		// The error names the connection's addresses (read tcp
		// 10.0.0.5:8443->…: i/o timeout): the log's business, not the
		// client's.
		log.LogAttrs(r.Context(), slog.LevelWarn, "request body unreadable: request refused", slog.String("error", err.Error()))
		m.reject(r.Context(), w, http.StatusBadRequest, ProblemBodyUnreadable, "Request body unreadable",
			"The request body could not be read completely; send it again with the same Idempotency-Key.")
		return
	}
	replayBody := new(bodyReader)
	replayBody.Reset(body)
	r.Body = replayBody
	fp := idem.NewFingerprint(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"), body)
	req := idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: m.cfg.Lease, TTL: m.cfg.TTL}

	ctx := r.Context()
	deadline := time.Now().Add(m.cfg.InflightWait)
	wk := waitKey{Scope: scope, Key: key}
	switch resp, seen := m.recent.Lookup(wk, fp); {
	case resp != nil:
		m.replayKept(ctx, w, log, resp)
		return
	case !seen:
		req.Unseen = true
	case m.answerFromRecord(ctx, w, req, log):
		return
	}
	// A duplicate watches for this process's own completion of the key,
	// but only once it has seen the key in flight: a first execution pays
	// nothing for it. The watch ends when serve returns, or before the
	// handler runs once the key is this request's.
	var watch keyWatch
	defer watch.stop()
	waits := 0
	m.beginPhase(ctx, PhaseClaim)
	for {
		claim, answered, err := m.claim(next, w, r, req, deadline, log, &watch)
		if answered {
			return
		}
		if err != nil {
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimError, Err: err})
			m.tally(ctx, OutcomeStoreError)
			log.LogAttrs(ctx, slog.LevelError, "idempotency store unavailable: request refused", slog.String("error", err.Error()))
			(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
				Detail: "The request was not run, because its idempotency key could not be claimed. Retry with the same key.", RetryAfter: 1}).Write(w)
			return
		}
		switch claim.Outcome {
		case idem.Mismatch:
			m.refuseMismatch(ctx, w, log, claim.Record.State)
			return
		case idem.Completed:
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimCompleted})
			m.recent.Keep(wk, claim.Record.Fingerprint, claim.Record.Response, claim.Record.ExpiresAt)
			m.replayKept(ctx, w, log, claim.Record.Response)
			return
		case idem.InFlight:
			// Claimed again, it is no longer a key nobody has seen.
			req.Unseen = false
			if !watch.watching() {
				// Watch from now on and look again at once, so a completion
				// between the claim and the watch cannot be missed.
				watch.start(&m.local, wk)
				continue
			}
			if !m.waitChange(ctx, wk, watch.changed, deadline, waits) {
				m.inFlightTooLong(ctx, w, log)
				return
			}
			waits++
			watch.start(&m.local, wk)
			continue
		case idem.Acquired:
			watch.stop()
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimAcquired, TookOver: claim.TookOver})
			if claim.TookOver {
				log.LogAttrs(ctx, slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(claim.Token)))
			}
			m.execute(next, w, r, Execution{Scope: scope, Key: key, Token: claim.Token, ClaimedAt: claim.Record.CreatedAt, TookOver: claim.TookOver,
				Recovery: claim.Record.Recovery},
				answerOf{fp: fp, expires: claim.Record.ExpiresAt}, log)
			return
		default:
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimError})
			m.tally(ctx, OutcomeStoreError)
			log.LogAttrs(ctx, slog.LevelError, "idempotency store returned an unknown outcome", slog.Int("outcome", int(claim.Outcome)))
			(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
				Detail: "The request was not run. Retry with the same key.", RetryAfter: 1}).Write(w)
			return
		}
	}
}

// claimSeparately is the claim of the forms whose claim commits on its
// own: one round trip to the store.
func (m *Middleware) claimSeparately(_ http.Handler, _ http.ResponseWriter, r *http.Request, req idem.ClaimRequest,
	_ time.Time, _ reqLog, _ *keyWatch) (idem.Claim, bool, error) {
	ctx := r.Context()
	m.markStore(ctx)
	claim, err := m.store.Claim(ctx, req)
	m.storeSince(ctx, StoreClaim, err)
	return claim, false, err
}

// keyWatch is a duplicate's watch for this process's completion of a key
// in flight (keywait.Local.Watch).
type keyWatch struct {
	changed <-chan struct{}
	end     func()
}

func (kw *keyWatch) watching() bool { return kw.changed != nil }

// start watches wk afresh, ending the watch before.
func (kw *keyWatch) start(local *keywait.Local, wk waitKey) {
	kw.stop()
	kw.changed, kw.end = local.Watch(wk)
}

// stop ends the watch, if any; the channel it watched stays, so that a
// stopped watch still counts as having watched.
func (kw *keyWatch) stop() {
	if kw.end != nil {
		kw.end()
		kw.end = nil
	}
}

// inFlightTooLong answers a duplicate that waited as long as it may, unless
// its client has gone.
func (m *Middleware) inFlightTooLong(ctx context.Context, w http.ResponseWriter, log reqLog) {
	m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimInFlight, Err: ctx.Err()})
	if ctx.Err() != nil {
		return // the client has gone; nobody reads an answer
	}
	m.tally(ctx, OutcomeConflict)
	log.LogAttrs(ctx, slog.LevelInfo, "duplicate still in flight after waiting")
	(&Problem{Type: ProblemInFlight, Title: "Request in flight", Status: http.StatusConflict,
		Detail: "A request with this Idempotency-Key is still being processed. Retry later with the same key to get its result.", RetryAfter: 1}).Write(w)
}

// waitGate waits until the execution held at the key's gate ends (true),
// or the deadline passes or the client goes away (false).
func (m *Middleware) waitGate(ctx context.Context, ended <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ended:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// waitChange blocks until the key may have changed, the poll interval
// passes, the deadline passes or the client goes away. It returns false when
// the caller should stop waiting.
func (m *Middleware) waitChange(ctx context.Context, wk waitKey, changed <-chan struct{}, deadline time.Time, attempt int) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	// Ask again soon at first (most requests finish quickly), then back off.
	step := 10 * time.Millisecond << min(attempt, 5)
	step = min(step, m.cfg.PollInterval, left)
	t := time.NewTimer(step)
	defer t.Stop()
	var storeSignal <-chan struct{}
	if m.waiter != nil {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan struct{})
		storeSignal = done
		go func() {
			defer close(done)
			m.waiter.WaitChange(wctx, wk.Scope, wk.Key)
		}()
		defer func() { cancel(); <-done }()
	}
	select {
	case <-changed:
	case <-storeSignal:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// reqLog logs about one protected request. The request's own attributes
// are added only to records that are actually logged, so with the level
// off a request costs nothing to log.
type reqLog struct {
	l            *slog.Logger
	scope        idem.Scope
	key          idem.Key
	method, path string
}

func (rl reqLog) LogAttrs(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if !rl.l.Enabled(ctx, level) {
		return
	}
	all := make([]slog.Attr, 0, len(attrs)+4)
	all = append(all, slog.Any("scope", rl.scope), slog.String("key", idem.KeyDigest(rl.scope, rl.key)),
		slog.String("method", rl.method), slog.String("path", rl.path))
	rl.l.LogAttrs(ctx, level, msg, append(all, attrs...)...)
}
