package idemhttp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Header names.
const (
	// HeaderKey carries the client's idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted is set to "true" on a replay whose original body was
	// too large to keep (see Config.MaxResponseBytes).
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
)

// Defaults of Config.
const (
	DefaultTTL              = 24 * time.Hour
	DefaultLease            = time.Minute
	DefaultInflightWait     = 5 * time.Second
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
)

// neverReplayed are headers that identify or authenticate a client: a
// replay must never hand them to whoever presents the key next.
var neverReplayed = map[string]bool{
	"Set-Cookie":          true,
	"Authorization":       true,
	"Proxy-Authorization": true,
	"Proxy-Authenticate":  true,
	"Www-Authenticate":    true,
	"Cookie":              true,
}

// Config configures a Middleware. The zero value of every field but Store
// means its default.
type Config struct {
	// Store keeps the keys. Required. When it implements idem.TxStore and
	// SeparateTx is false, the handler runs inside Store.CompleteTx, so its
	// writes to the store's database and the stored response commit
	// together, and nothing reaches the client before that commit. When it
	// also implements idem.TxClaimer, the key is claimed in that same
	// transaction (TxClaimer.ClaimTx).
	Store idem.Store

	// SeparateTx forces the two-step form (claim, run, complete) even with a
	// TxStore or TxClaimer. Defaults to false.
	SeparateTx bool

	// Optional lets requests without a key through, unprotected. Defaults to
	// false: a request without a key gets 400.
	Optional bool

	// Methods are the methods the middleware protects; others pass through
	// untouched. Defaults to POST and PATCH.
	Methods []string

	// Scope returns who owns the request's key (a tenant, an API key). Keys
	// never cross scopes. An error answers 400 and runs nothing; its text is
	// logged, not sent, since it may tell internal details. To tell the
	// client something, return a *Problem (or an error wrapping one): it is
	// sent as it is, with status 400, and type ProblemScope and its title,
	// where it leaves them empty. Required, unless SharedScope says that
	// every caller shares one scope.
	Scope func(r *http.Request) (idem.Scope, error)

	// SharedScope puts every request's key in one scope, shared by all
	// callers, when Scope is nil. Then a key one caller sent is the same key
	// for any other: a second caller who sends it (by chance, or having
	// seen it) gets the first caller's answer replayed, and one who sends
	// it with another body gets 422. Set it only for a service with one
	// caller, or whose keys are unguessable and never shared; otherwise
	// give Scope, keyed by whoever authenticated the request. Defaults to
	// false: New refuses a Config with neither.
	SharedScope bool

	// TTL is how long a key is remembered from its claim. Defaults to 24h.
	TTL time.Duration

	// Lease is how long an execution holds its key before a retry may take
	// it over (after a crash, say). The handler's context is cancelled when
	// 90% of it has passed, so a well-behaved handler finishes inside its
	// lease. Defaults to 1m, or TTL when that is shorter.
	Lease time.Duration

	// InflightWait is how long a duplicate waits for the first execution to
	// finish before it gets 409 with Retry-After. Negative means not at all.
	// Defaults to 5s.
	InflightWait time.Duration

	// MaxBodyBytes caps the request body the middleware reads to fingerprint
	// it; a larger body gets 413 and runs nothing. Defaults to 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes caps the response body kept for replay. Defaults to
	// 1 MiB. A larger response is never silently truncated:
	//   - with the same-transaction form the transaction is rolled back, the
	//     key released, and the client gets 500 (response-too-large);
	//   - otherwise the effect has happened: the client gets the whole
	//     response, and the key is completed with the status and headers but
	//     no body; replays then carry Idempotent-Body-Omitted: true.
	MaxResponseBytes int

	// ReplayHeaders are response headers kept and replayed besides
	// Content-Type, Content-Language and Location. Set-Cookie,
	// Authorization and other credentials are refused by New. Defaults to none.
	ReplayHeaders []string

	// Keep decides, from the handler's status, whether an answer is kept and
	// replayed (a deterministic outcome) or the key released so a retry runs
	// again (a transient failure). Panics and timeouts are never kept.
	// Defaults to DefaultKeep.
	Keep func(r *http.Request, status int) bool

	// PollInterval is the longest a waiting duplicate goes without asking the
	// store again, for changes made by other processes when the store is not
	// an idem.Waiter. Defaults to 250ms.
	PollInterval time.Duration

	// RecentKeys is how many keys the middleware remembers having seen
	// completed in this process. A duplicate of one of them is answered
	// with a single read of the store (idem.Replayer's Replay where the
	// store has it, Store.Get otherwise), without claiming it: no
	// transaction, no write; should the read find the key anything but
	// completed, the request is claimed as any other. Duplicates that reach
	// another process are claimed there, and answered from the claim.
	// Defaults to 65,536 (some 10 MB at most); negative remembers none.
	RecentKeys int

	// MemoryReplayFor is how long after a completion this process keeps
	// the answer of one of its RecentKeys in memory: a duplicate that
	// reaches it meanwhile is answered from there, with no read of the
	// store at all. A completed record does not change until it expires,
	// so that is the answer the store would give; an answer is never kept
	// past the record's expiry less MemoryReplayFor, which leaves that
	// much room for the difference between Clock and the store's clock.
	// The one thing it does not see is a record deleted before its expiry,
	// by hand in the database: this process may replay it for up to
	// MemoryReplayFor after. Defaults to 10s (retries come soon after the
	// first try); negative keeps none, and every duplicate reads the
	// store.
	MemoryReplayFor time.Duration

	// MemoryReplayBytes bounds the memory the answers of MemoryReplayFor
	// take, oldest dropped first; an answer larger than 1/64 of it is not
	// kept (its duplicates read the store). Defaults to 32 MiB.
	MemoryReplayBytes int

	// Clock tells MemoryReplayFor's time. Defaults to idem.SystemClock;
	// give it the store's clock when that is not the system's (a test's
	// manual clock).
	Clock idem.Clock

	// KeySecret, when set, seals every key before the store sees it: the
	// store keeps SealKey(KeySecret, scope, key), an HMAC-SHA-256 digest,
	// never the key a client sent, so a dump of the store does not show
	// them. Execution.Key is then the sealed key, which is what an effect
	// should record. At least MinKeySecretLen bytes, random, the same for
	// every replica, and kept out of the store. Changing it makes every key
	// kept under the old one unknown (their duplicates run again): see
	// doc.go, "Keys and answers at rest". Defaults to none: keys are kept as
	// they are.
	KeySecret []byte

	// BodyKeys, when set, encrypt the response bodies kept for replay
	// (AES-256-GCM, bound to their record's scope and key). The first key
	// seals; every key opens, so a new key goes first and an old one stays
	// until the TTL has passed since it last sealed. A body kept before
	// BodyKeys was set is replayed as it is. Defaults to none: bodies are
	// kept as the handler wrote them.
	BodyKeys []BodyKey

	// DiscardBodies keeps only the status and the replayed headers of an
	// answer, never its body: a replay carries Idempotent-Body-Omitted:
	// true and no body. Defaults to false.
	DiscardBodies bool

	// Observer sees the phases of every protected request (claim, handler,
	// complete, replay) and every round trip to the store, for tracing and
	// latency histograms: see package idemotel for OpenTelemetry spans and
	// idemprom for Prometheus histograms, and Observers to have both.
	// Defaults to nil: nothing is observed, at no cost.
	Observer Observer

	// Logger receives one record per protected request, and the errors
	// that clients are not shown. Keys are logged as idem.KeyDigest of
	// their scope and key, never as they are.
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

// defaultRecentKeys is Config.RecentKeys's default, and the next two
// Config.MemoryReplayFor's and Config.MemoryReplayBytes's.
const (
	defaultRecentKeys        = 1 << 16
	defaultMemoryReplayFor   = 10 * time.Second
	defaultMemoryReplayBytes = 32 << 20
)

// DefaultKeep keeps every 2xx, 3xx and 4xx answer except those that by
// definition ask the client to retry later: 408 Request Timeout, 425 Too
// Early and 429 Too Many Requests. 5xx answers are transient: the key is
// released so a retry really runs again.
func DefaultKeep(_ *http.Request, status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

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
)

// Outcomes lists every Outcome, in a stable order.
var Outcomes = []Outcome{
	OutcomeExecuted, OutcomeReplayed, OutcomeConflict, OutcomeMismatch,
	OutcomeReleased, OutcomeStoreError, OutcomeLeaseLost, OutcomeRejected, OutcomeAborted,
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
	waiter   idem.Waiter
	methods  map[string]bool
	replay   []string
	log      *slog.Logger
	local    localWaits
	gates    claimGates
	// recent are the keys seen completed lately (nil: none are kept).
	recent *recentKeys
	// bodies seals kept bodies (nil: they are kept as they are).
	bodies *bodySealer
	// keys seals keys (nil: they are kept as they are).
	keys   *keySealer
	counts [9]atomic.Uint64
	// obs is Config.Observer; storeName the store's type, for it.
	obs       Observer
	storeName string
}

// New applies the defaults to cfg, validates it and returns a Middleware.
func New(cfg *Config) (*Middleware, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := *cfg
	if c.Store == nil {
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.Store", Reason: "is required"}
	}
	if c.Scope == nil && !c.SharedScope {
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.Scope", Reason: "is required: give keys a scope per caller " +
			"(a tenant, an API key), or set SharedScope to share one scope among all callers, replays across callers included"}
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Lease == 0 {
		// A TTL shorter than the default lease lowers the lease, rather
		// than refuse a configuration that never set one.
		c.Lease = DefaultLease
		if c.TTL > 0 && c.TTL < c.Lease {
			c.Lease = c.TTL
		}
	}
	if c.InflightWait == 0 {
		c.InflightWait = DefaultInflightWait
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.Keep == nil {
		c.Keep = DefaultKeep
	}
	if c.PollInterval == 0 {
		c.PollInterval = 250 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.TTL < 0:
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.TTL", Reason: "must not be negative"}
	case c.Lease < 0:
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.Lease", Reason: "must not be negative"}
	case c.TTL < c.Lease:
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.TTL", Reason: fmt.Sprintf("(%s) must not be shorter than Config.Lease (%s)", c.TTL, c.Lease)}
	case c.MaxBodyBytes < 0:
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.MaxBodyBytes", Reason: "must not be negative"}
	case c.MaxResponseBytes < 0:
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.MaxResponseBytes", Reason: "must not be negative"}
	case c.PollInterval < 0:
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.PollInterval", Reason: "must not be negative"}
	}
	if c.RecentKeys == 0 {
		c.RecentKeys = defaultRecentKeys
	}
	if c.MemoryReplayFor == 0 {
		c.MemoryReplayFor = defaultMemoryReplayFor
	}
	if c.MemoryReplayBytes == 0 {
		c.MemoryReplayBytes = defaultMemoryReplayBytes
	}
	if c.MemoryReplayBytes < 0 {
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.MemoryReplayBytes", Reason: "must not be negative"}
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.KeySecret != nil && len(c.KeySecret) < MinKeySecretLen {
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.KeySecret", Reason: fmt.Sprintf("is %d bytes; at least %d are needed", len(c.KeySecret), MinKeySecretLen)}
	}
	c.KeySecret = bytes.Clone(c.KeySecret)
	bodies, err := newBodySealer(c.BodyKeys)
	if err != nil {
		return nil, &idem.ArgumentError{Field: "idemhttp.Config.BodyKeys", Reason: err.Error()}
	}
	m := &Middleware{cfg: c, store: c.Store, methods: map[string]bool{}, log: c.Logger, recent: newRecentKeys(c.RecentKeys, c.MemoryReplayFor, c.MemoryReplayBytes, c.Clock), bodies: bodies, keys: newKeySealer(c.KeySecret)}
	m.replayer, _ = c.Store.(idem.Replayer)
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
	if ts, ok := c.Store.(idem.TxStore); ok && !c.SeparateTx {
		m.txStore = ts
		m.txClaimer, _ = ts.(idem.TxClaimer)
	}
	if w, ok := c.Store.(idem.Waiter); ok {
		m.waiter = w
	}
	m.local.m = make(map[waitKey]*waitEntry)
	return m, nil
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

type ctxKey struct{}

// execCtx is the handler's context. It behaves as
// context.WithValue(context.WithDeadline(parent, deadline), ctxKey{}, ex),
// but makes the deadline's context (a timer, and a registration with the
// parent) only once something asks for more than the Execution or the
// deadline: Done, Err or another value. A handler that never looks at its
// context (a trivial one) then costs no timer, and one that does sees
// exactly what WithDeadline gives.
type execCtx struct {
	parent   context.Context
	deadline time.Time
	ex       Execution
	noEx     bool // carries no Execution of its own (detached's)

	inner   atomic.Pointer[deadlineCtx] // nil until needed
	mu      sync.Mutex                  // serialises making inner, and stop
	stopped bool
}

type deadlineCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newExecCtx(parent context.Context, timeout time.Duration, ex Execution) *execCtx {
	d := time.Now().Add(timeout)
	if pd, ok := parent.Deadline(); ok && pd.Before(d) {
		d = pd // as WithDeadline reports it
	}
	return &execCtx{parent: parent, deadline: d, ex: ex}
}

// ctx returns the deadline's context, making it on first use; once stop
// has run it is made cancelled.
func (c *execCtx) ctx() context.Context {
	if in := c.inner.Load(); in != nil {
		return in.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.inner.Load(); in != nil {
		return in.ctx
	}
	ctx, cancel := context.WithDeadline(c.parent, c.deadline)
	if c.stopped {
		cancel()
	}
	c.inner.Store(&deadlineCtx{ctx: ctx, cancel: cancel})
	return ctx
}

// stop cancels the context, as the CancelFunc of WithDeadline does.
func (c *execCtx) stop() {
	c.mu.Lock()
	c.stopped = true
	in := c.inner.Load()
	c.mu.Unlock()
	if in != nil {
		in.cancel()
	}
}

func (c *execCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *execCtx) Done() <-chan struct{}       { return c.ctx().Done() }
func (c *execCtx) Err() error                  { return c.ctx().Err() }

func (c *execCtx) String() string {
	return fmt.Sprintf("%v.WithDeadline(%s).WithValue(idemhttp.Execution)", c.parent, c.deadline)
}

func (c *execCtx) Value(key any) any {
	if _, ok := key.(ctxKey); ok {
		if c.noEx {
			return c.parent.Value(key)
		}
		return c.ex
	}
	// Other values include the context package's own lookups (for
	// cancellation and Cause), which must find the deadline's context.
	return c.ctx().Value(key)
}

// Execution describes the protected request whose handler is running.
type Execution struct {
	Scope idem.Scope
	Key   idem.Key
	// Token is this execution's fencing token.
	Token idem.Token
	// ClaimedAt is the key's Record.CreatedAt: the same for every execution
	// of one logical request (a takeover after a crash keeps it), different
	// once the key expired and was claimed anew. (Scope, Key, ClaimedAt) is
	// what an effect outside the key store records under a unique constraint
	// so that a re-run finds the earlier effect instead of repeating it.
	ClaimedAt time.Time
	// TookOver reports that an earlier execution's lease ended before it
	// finished: it may have crashed half-way, or be still running.
	TookOver bool
}

// ExecutionFromContext returns the protected request's Execution.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	e, ok := ctx.Value(ctxKey{}).(Execution)
	return e, ok
}

// KeyFromContext returns the scope and key of the protected request whose
// handler is running, so the handler can pass the key downstream as the
// idempotency key of the next call.
func KeyFromContext(ctx context.Context) (idem.Scope, idem.Key, bool) {
	e, ok := ExecutionFromContext(ctx)
	return e.Scope, e.Key, ok
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
	wk := waitKey{scope, key}
	switch resp, seen := m.recent.lookup(wk, fp); {
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
	// nothing for it.
	var changed <-chan struct{}
	unwatch := func() {}
	waits := 0
	m.beginPhase(ctx, PhaseClaim)
	for {
		var claim idem.Claim
		if m.txClaimer != nil {
			if ended, fp, done := m.gates.executing(wk); ended != nil {
				if fp != req.Fingerprint {
					// Another request under a key in flight: refused at
					// once, as a claim that saw the key in flight would.
					done()
					unwatch()
					m.refuseMismatch(ctx, w, log, idem.StateInFlight)
					return
				}
				ok := m.waitGate(ctx, ended, deadline)
				done()
				if !ok {
					unwatch()
					m.inFlightTooLong(ctx, w, log)
					return
				}
				continue
			}
			var ran bool
			// Once the key is ours, before the handler runs (it may end in
			// a panic), stop watching.
			acquired := func() { unwatch(); unwatch = func() {} }
			if claim, ran, err = m.claimTx(next, w, r, req, deadline, log, acquired); ran {
				return
			}
		} else {
			m.markStore(ctx)
			claim, err = m.store.Claim(ctx, req)
			m.storeSince(ctx, StoreClaim, err)
		}
		if err != nil {
			unwatch()
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimError, Err: err})
			m.tally(ctx, OutcomeStoreError)
			log.LogAttrs(ctx, slog.LevelError, "idempotency store unavailable: request refused", slog.String("error", err.Error()))
			(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
				Detail: "The request was not run, because its idempotency key could not be claimed. Retry with the same key.", RetryAfter: 1}).Write(w)
			return
		}
		switch claim.Outcome {
		case idem.Mismatch:
			unwatch()
			m.refuseMismatch(ctx, w, log, claim.Record.State)
			return
		case idem.Completed:
			unwatch()
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimCompleted})
			m.recent.keep(wk, claim.Record.Fingerprint, claim.Record.Response, claim.Record.ExpiresAt)
			m.replayKept(ctx, w, log, claim.Record.Response)
			return
		case idem.InFlight:
			// Claimed again, it is no longer a key nobody has seen.
			req.Unseen = false
			if changed == nil {
				// Watch from now on and look again at once, so a completion
				// between the claim and the watch cannot be missed.
				changed, unwatch = m.local.watch(wk)
				continue
			}
			if !m.waitChange(ctx, wk, changed, deadline, waits) {
				unwatch()
				m.inFlightTooLong(ctx, w, log)
				return
			}
			waits++
			unwatch()
			changed, unwatch = m.local.watch(wk)
			continue
		case idem.Acquired:
			unwatch()
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimAcquired, TookOver: claim.TookOver})
			if claim.TookOver {
				log.LogAttrs(ctx, slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(claim.Token)))
			}
			m.execute(next, w, r, Execution{Scope: scope, Key: key, Token: claim.Token, ClaimedAt: claim.Record.CreatedAt, TookOver: claim.TookOver},
				answerOf{fp: fp, expires: claim.Record.ExpiresAt}, log)
			return
		default:
			unwatch()
			m.endPhase(ctx, PhaseClaim, Event{Claim: ClaimError})
			m.tally(ctx, OutcomeStoreError)
			log.LogAttrs(ctx, slog.LevelError, "idempotency store returned an unknown outcome", slog.Int("outcome", int(claim.Outcome)))
			(&Problem{Type: ProblemStoreUnavailable, Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable,
				Detail: "The request was not run. Retry with the same key.", RetryAfter: 1}).Write(w)
			return
		}
	}
}

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
	m.recent.keep(waitKey{req.Scope, req.Key}, rec.Fingerprint, rec.Response, rec.ExpiresAt)
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

// bodyReader hands the handler the body the middleware read: a
// bytes.Reader that closes, in one allocation rather than the two of
// io.NopCloser(bytes.NewReader(body)).
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// readBody reads at most limit bytes; tooLarge reports a longer body.
func readBody(r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if r.ContentLength > limit {
		return nil, true, nil
	}
	// A body of announced length is read into one buffer of that size
	// (and a byte more, to see the end without growing it); one of
	// unknown length starts as io.ReadAll would.
	size := int64(512)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1
	}
	body = make([]byte, 0, min(size, limit+1))
	for {
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)]
		}
		// Never read more than a byte past the limit: enough to tell
		// that the body is too large.
		room := min(int64(cap(body)-len(body)), limit+1-int64(len(body)))
		n, rerr := r.Body.Read(body[len(body) : len(body)+int(room)])
		body = body[:len(body)+n]
		switch {
		case rerr != nil && rerr != io.EOF:
			return nil, false, fmt.Errorf("reading the request body: %w", rerr)
		case int64(len(body)) > limit:
			return nil, true, nil
		case rerr == io.EOF:
			return body, false, nil
		}
	}
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
			m.waiter.WaitChange(wctx, wk.scope, wk.key)
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

// detached is the context for writing an outcome after the effect: a client
// hanging up must not leave the key in flight.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	// An execCtx with no Execution of its own (the request's, if any,
	// comes from ctx): its timer is made only if the store asks for Done
	// or Err (rueidis reads the deadline alone), which saves a first
	// execution on Redis about a microsecond.
	c := newExecCtx(context.WithoutCancel(ctx), 10*time.Second, Execution{})
	c.noEx = true
	return c, c.stop
}

// answerOf is what the middleware keeps in memory of a completion, beside
// the answer (see Config.MemoryReplayFor): the request's fingerprint and
// when its record expires.
type answerOf struct {
	fp      idem.Fingerprint
	expires time.Time
}

func (m *Middleware) execute(next http.Handler, w http.ResponseWriter, r *http.Request, ex Execution, of answerOf, log reqLog) {
	ref := idem.Ref{Scope: ex.Scope, Key: ex.Key, Token: ex.Token}
	defer m.local.notify(waitKey{ref.Scope, ref.Key})
	hctx := newExecCtx(m.beginPhase(r.Context(), PhaseHandler), m.cfg.Lease*9/10, ex)
	defer hctx.stop()

	if m.txStore != nil {
		m.markStore(r.Context())
		m.executeTx(next, w, r, hctx, ref, of, log)
		return
	}

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
			m.recent.keep(waitKey{ref.Scope, ref.Key}, of.fp, &kept, of.expires)
			m.tally(r.Context(), OutcomeExecuted)
			log.LogAttrs(r.Context(), slog.LevelDebug, "executed", slog.Int("status", status))
		}
		rec.send(nil)
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

func (m *Middleware) executeTx(next http.Handler, w http.ResponseWriter, r *http.Request, hctx context.Context, ref idem.Ref, of answerOf, log reqLog) {
	run := &txRun{rec: newRecorder(w, m.cfg.MaxResponseBytes, false), of: of}
	kept, err := m.txStore.CompleteTx(hctx, ref, func(txctx context.Context) (idem.Response, bool, error) {
		return m.runTx(next, r, run, txctx)
	})
	m.finishTx(w, r, ref, run, kept, err, false, log)
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
		endGate = m.gates.begin(waitKey{req.Scope, req.Key}, req.Fingerprint)
		if c.TookOver {
			log.LogAttrs(r.Context(), slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(c.Token)))
		}
		hctx = newExecCtx(m.beginPhase(txctx, PhaseHandler), m.cfg.Lease*9/10, Execution{Scope: req.Scope, Key: req.Key, Token: c.Token, ClaimedAt: c.Record.CreatedAt, TookOver: c.TookOver})
		return m.runTx(next, r, run, hctx)
	})
	if claim.Outcome != idem.Acquired {
		m.storeSince(r.Context(), StoreClaim, err)
		return claim, false, err
	}
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	defer m.local.notify(waitKey{ref.Scope, ref.Key})
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
		m.recent.keep(waitKey{ref.Scope, ref.Key}, run.of.fp, &run.kept, run.of.expires)
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
