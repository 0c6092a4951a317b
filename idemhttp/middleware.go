package idemhttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

// Outcome names what the middleware did with one protected request.
type Outcome string

// Outcomes, as counted by Middleware.Counts.
const (
	OutcomeExecuted   Outcome = "executed"    // ran and its answer was kept
	OutcomeReplayed   Outcome = "replayed"    // a duplicate got the kept answer
	OutcomeConflict   Outcome = "conflict"    // 409: still in flight after InflightWait
	OutcomeMismatch   Outcome = "mismatch"    // 422: the key was used with another request
	OutcomeReleased   Outcome = "released"    // ran and failed transiently; key released
	OutcomeStoreError Outcome = "store_error" // the store failed; 503 or an unkept answer
	OutcomeLeaseLost  Outcome = "lease_lost"  // the completion was refused (fencing)
	OutcomeRejected   Outcome = "rejected"    // 400/413: missing or malformed key, body too large
	OutcomeAborted    Outcome = "aborted"     // the handler aborted (http.ErrAbortHandler) outside a shared transaction; key left to its lease
	OutcomeUnfinished Outcome = "unfinished"  // failed after a recovery point; key left in flight for a retry or a Completer
)

// Outcomes lists every Outcome, in a stable order.
var Outcomes = []Outcome{
	OutcomeExecuted, OutcomeReplayed, OutcomeConflict, OutcomeMismatch,
	OutcomeReleased, OutcomeStoreError, OutcomeLeaseLost, OutcomeRejected, OutcomeAborted,
	OutcomeUnfinished,
}

// Middleware makes unsafe requests idempotent. Create it with New; it is
// safe for concurrent use, and one Middleware may wrap many routes.
type Middleware struct {
	cfg     Config
	store   idem.Store
	txStore idem.TxStore
	// txClaimer is txStore when it claims keys in its transaction too.
	txClaimer idem.TxClaimer
	// replayer is the store when it reads replays narrowly.
	replayer idem.Replayer
	// recoverer is the store when it keeps recovery points.
	recoverer idem.Recoverer
	waiter    idem.Waiter
	methods   map[string]bool
	replay    []string
	log       *slog.Logger
	local     keywait.Local
	gates     keywait.Gates
	// recent are the keys seen completed lately (nil: none are kept).
	recent *recentKeys
	// bodies seals kept bodies (nil: they are kept as they are).
	bodies *bodySealer
	// keys seals keys (nil: they are kept as they are).
	keys   *keySealer
	counts []atomic.Uint64 // one per Outcomes
	// obs is Config.Observer; storeName the store's type, for it.
	obs       Observer
	storeName string

	// claim and run are the form chosen in New (see chooseForm): how a key
	// is claimed, and how the handler runs once it is.
	claim claimFunc
	run   runFunc
}

// claimFunc claims req's key. answered says that it answered the request
// itself: the claim's transaction ran the handler (ClaimTx), or the key's
// gate refused the request or let it wait too long. Otherwise serve answers
// by the claim's outcome, or by err.
type claimFunc func(next http.Handler, w http.ResponseWriter, r *http.Request, req idem.ClaimRequest,
	deadline time.Time, log reqLog, watch *keyWatch) (claim idem.Claim, answered bool, err error)

// runFunc runs the handler for a key claimed (ref), with hctx its
// context, and answers.
type runFunc func(next http.Handler, w http.ResponseWriter, r *http.Request, hctx *execCtx, ref idem.Ref, of answerOf, log reqLog)

// New applies the defaults to cfg, validates it and returns a Middleware.
func New(cfg *Config) (*Middleware, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	bodies, err := newBodySealer(c.BodyKeys)
	if err != nil {
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.BodyKeys", Reason: err.Error()}
	}
	m := &Middleware{cfg: c, store: c.Store, methods: map[string]bool{}, log: c.Logger, recent: newRecentKeys(c.RecentKeys, c.MemoryReplayFor, c.MemoryReplayBytes, c.Clock), bodies: bodies, keys: newKeySealer(c.KeySecret),
		counts: make([]atomic.Uint64, len(Outcomes))}
	m.replayer, _ = c.Store.(idem.Replayer)
	m.recoverer, _ = c.Store.(idem.Recoverer)
	m.obs, m.storeName = c.Observer, fmt.Sprintf("%T", c.Store)
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
	m.chooseForm()
	if w, ok := c.Store.(idem.Waiter); ok {
		m.waiter = w
	}
	return m, nil
}

// chooseForm decides, once, how the middleware claims a key and runs its
// handler, from what the store offers (see Config.Store):
//   - the separate form: Claim, run the handler, then Complete or Release;
//   - CompleteTx: Claim, then run the handler inside the store's
//     transaction, which keeps the answer as it commits;
//   - ClaimTx: claim the key inside the transaction the handler then runs
//     in, so that the claim, the handler's writes and the answer commit
//     together, and a duplicate in this process waits at the key's gate.
//
// A store whose writes run one at a time (idem.SerialWriter: SQLite) gets
// the CompleteTx form even when it offers ClaimTx: ClaimTx's transaction,
// begun at the claim, would hold the only writer through everything the
// handler does before it writes, and every other request would wait that
// long; CompleteTx's begins at the handler's first write.
func (m *Middleware) chooseForm() {
	m.claim, m.run = m.claimSeparately, m.runSeparately
	ts, ok := m.store.(idem.TxStore)
	if !ok || m.cfg.SeparateTx {
		return
	}
	m.txStore, m.run = ts, m.runInTx
	if sw, ok := ts.(idem.SerialWriter); ok && sw.WritesSerially() {
		return
	}
	if tc, ok := ts.(idem.TxClaimer); ok {
		m.txClaimer, m.claim = tc, m.claimInTx
	}
}

// Counts returns how many protected requests ended in each Outcome.
func (m *Middleware) Counts() map[Outcome]uint64 {
	out := make(map[Outcome]uint64, len(Outcomes))
	for i, o := range Outcomes {
		out[o] = m.counts[i].Load()
	}
	return out
}

func (m *Middleware) count(o Outcome) {
	for i, x := range Outcomes {
		if x == o {
			m.counts[i].Add(1)
			return
		}
	}
}

// Handler wraps next so that every request with a protected method is
// executed at most once per key.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		if m.obs != nil {
			m.serveObserved(next, w, r)
			return
		}
		m.serve(next, w, r)
	})
}

func (m *Middleware) reject(ctx context.Context, w http.ResponseWriter, status int, typ, title, detail string) {
	m.tally(ctx, OutcomeRejected)
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
		m.tally(r.Context(), OutcomeRejected)
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
	m.reject(r.Context(), w, http.StatusBadRequest, ProblemScope, scopeTitle,
		"The server could not tell whom this request's Idempotency-Key belongs to, so nothing was run. Check the request's credentials and send it again.")
}
