package idemhttp

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Outcome names what the middleware did with one protected request: the
// engine's outcomes (keyed.Outcome), the same on every face.
type Outcome = keyed.Outcome

// Outcomes, as counted by Middleware.Counts.
const (
	OutcomeExecuted   = keyed.OutcomeExecuted   // ran and its answer was kept
	OutcomeReplayed   = keyed.OutcomeReplayed   // a duplicate got the kept answer
	OutcomeConflict   = keyed.OutcomeConflict   // 409: still in flight after InflightWait
	OutcomeMismatch   = keyed.OutcomeMismatch   // 422: the key was used with another request
	OutcomeReleased   = keyed.OutcomeReleased   // ran and failed transiently; key released
	OutcomeStoreError = keyed.OutcomeStoreError // the store failed; 503 or an unkept answer
	OutcomeLeaseLost  = keyed.OutcomeLeaseLost  // the completion was refused (fencing)
	OutcomeRejected   = keyed.OutcomeRejected   // 400/413: missing or malformed key, body too large
	OutcomeAborted    = keyed.OutcomeAborted    // the handler aborted (http.ErrAbortHandler) outside a shared transaction; key left to its lease
	OutcomeUnfinished = keyed.OutcomeUnfinished // failed after a recovery point; key left in flight for a retry or a Completer
)

// Outcomes lists every Outcome, in a stable order.
var Outcomes = keyed.Outcomes

// Middleware makes unsafe requests idempotent. Create it with New; it is
// safe for concurrent use, and one Middleware may wrap many routes. It is
// a face of the engine (package keyed): it reads the key and fingerprints
// the request, and speaks the engine's answers as HTTP; every decision
// about the key is the engine's.
type Middleware struct {
	cfg     Config
	eng     *keyed.Engine
	methods map[string]bool
	replay  []string
	log     *slog.Logger
	obs     bool // the engine has an Observer
}

// New applies the defaults to cfg, validates it and returns a Middleware.
func New(cfg *Config) (*Middleware, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	eng, err := keyed.New(c.engineConfig())
	if err != nil {
		return nil, renamed(err)
	}
	c.applied(eng.Config())
	m := &Middleware{cfg: c, eng: eng, methods: map[string]bool{}, log: c.Logger, obs: c.Observer != nil}
	for _, meth := range c.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	m.replay = []string{"Content-Type", "Content-Language", "Location"}
	for _, h := range c.ReplayHeaders {
		ch := http.CanonicalHeaderKey(h)
		if neverReplayed[ch] {
			return nil, &idem.ArgumentError{Field: "idemhttp.Config.ReplayHeaders", Reason: ch + " must never be replayed to another caller"}
		}
		m.replay = append(m.replay, ch)
	}
	return m, nil
}

// Engine returns the engine the middleware is a face of.
func (m *Middleware) Engine() *keyed.Engine { return m.eng }

// Counts returns how many protected requests ended in each Outcome.
func (m *Middleware) Counts() map[Outcome]uint64 { return m.eng.Counts() }

// Handler wraps next so that every request with a protected method is
// executed at most once per key.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] || (m.cfg.Optional && len(r.Header.Values(HeaderKey)) == 0) {
			// Not protected: none of the engine's business, so nothing is
			// observed or counted (as on idemgrpc).
			next.ServeHTTP(w, r)
			return
		}
		if m.obs {
			ctx := m.eng.Begin(r.Context(), r)
			defer m.eng.End(ctx)
			r = r.WithContext(ctx)
		}
		m.serve(next, w, r)
	})
}

func (m *Middleware) reject(ctx context.Context, w http.ResponseWriter, scope idem.Scope, key idem.Key, status int, typ, title, detail string) {
	m.eng.Reject(ctx, scope, key)
	(&Problem{Type: typ, Title: title, Status: status, Detail: detail}).Write(w)
}

const scopeTitle = "Cannot tell who owns this key"

// rejectScope answers a request whose Scope function failed. That error is
// the application's, and may say anything (a database's address, a wiring
// mistake), so it is logged and the client gets a fixed detail, unless it
// is a *Problem: then the application wrote it for the client, and it is
// sent as it is, with what it leaves empty filled in.
func (m *Middleware) rejectScope(w http.ResponseWriter, r *http.Request, key idem.Key, err error) {
	var p *Problem
	if errors.As(err, &p) {
		m.eng.Reject(r.Context(), "", "")
		q := *p
		if q.Status == 0 {
			q.Status = http.StatusBadRequest
		}
		if q.Type == "" {
			q.Type, q.Title = ProblemScope, cmp.Or(q.Title, scopeTitle)
		}
		q.Write(w)
		return
	}
	// No scope, so no KeyDigest: the key alone is digested.
	m.log.LogAttrs(r.Context(), slog.LevelWarn, "scope unavailable: request refused", slog.Any("key", key),
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	m.reject(r.Context(), w, "", "", http.StatusBadRequest, ProblemScope, scopeTitle,
		"The server could not tell whom this request's Idempotency-Key belongs to, so nothing was run. Check the request's credentials and send it again.")
}

// rejectEmptyScope answers 401 to a request whose Scope returned no
// scope and no error (a tenant header the request lacks, say): outside
// SharedScope, every such request would otherwise share one set of keys
// and answers with every other caller that has none.
func (m *Middleware) rejectEmptyScope(w http.ResponseWriter, r *http.Request, key idem.Key) {
	m.log.LogAttrs(r.Context(), slog.LevelWarn, "empty scope: request refused", slog.Any("key", key),
		slog.String("method", r.Method), slog.String("path", r.URL.Path))
	m.reject(r.Context(), w, "", "", http.StatusUnauthorized, ProblemScope, scopeTitle,
		"The server could not tell whom this request's Idempotency-Key belongs to (no tenant or credentials), so nothing was run. Send it again with its credentials.")
}

// Restart ends at once the leases an earlier incarnation of this replica
// (Config.Holder) held when it died, on a store that keeps holders
// (idem.Restarter), and returns how many: see keyed.Engine.Restart. Call
// it once as the process starts, before the Completer.
func (m *Middleware) Restart(ctx context.Context) (int, error) { return m.eng.Restart(ctx) }
