package idemhttp

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
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
	DefaultTTL              = keyed.DefaultTTL
	DefaultLease            = keyed.DefaultLease
	DefaultTimeout          = keyed.DefaultTimeout
	DefaultInflightWait     = keyed.DefaultInflightWait
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
	// transaction (TxClaimer.ClaimTx), unless it writes serially
	// (idem.SerialWriter: idemsqlite), where that transaction would hold
	// the only writer through whatever the handler does before it writes;
	// there the key is claimed with one short write first.
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
	// where it leaves them empty. An empty scope without an error is
	// refused, 401 with type ProblemScope, and nothing runs, unless
	// SharedScope is set too: a Scope that reads a tenant header returns ""
	// for a request without one, and such requests must not share one set
	// of keys and answers. Required, unless SharedScope says that every
	// caller shares one scope.
	Scope func(r *http.Request) (idem.Scope, error)

	// SharedScope puts every request's key in one scope, shared by all
	// callers, when Scope is nil; with Scope, it lets Scope's empty scope
	// through as that shared one. Then a key one caller sent is the same key
	// for any other: a second caller who sends it (by chance, or having
	// seen it) gets the first caller's answer replayed, and one who sends
	// it with another body gets 422. Set it only for a service with one
	// caller, or whose keys are unguessable and never shared; otherwise
	// give Scope, keyed by whoever authenticated the request. Defaults to
	// false: New refuses a Config with neither.
	SharedScope bool

	// TTL is how long a key is remembered from its claim. Defaults to 24h.
	TTL time.Duration

	// Lease is how long an execution holds its key, past its last renewal,
	// before a retry may take it over: how soon the key of a holder that
	// died is free again. A running execution renews it every third of it,
	// so a live one keeps its key however long it runs (up to Timeout); one
	// that cannot renew it before it ends (the store unreachable) has its
	// context cancelled, so that it stops before another takes over.
	// Defaults to 10s, or TTL when that is shorter.
	Lease time.Duration

	// Timeout bounds one execution of the handler: its context ends then.
	// It does not end when the caller goes away, nor at the call's own
	// deadline: the caller's retry is then due, and should find the answer
	// kept rather than an execution cut off half-way to run again.
	// Defaults to 1m.
	Timeout time.Duration

	// Holder names this process as the holder of the keys it claims: a
	// replica (a name it keeps when it restarts) and its incarnation (new
	// at every start). With a store that keeps holders (idem.Restarter),
	// Restart ends at once the leases an earlier incarnation of the
	// replica held when it died. Defaults to none: claims are anonymous.
	Holder idem.Holder

	// Timers schedule the lease's renewals. Defaults to idem.RuntimeTimers;
	// a test that drives Clock by hand gives the same clock here (an
	// idemmem.Clock is both).
	Timers idem.Timers

	// InflightWait is how long a duplicate waits for the first execution to
	// finish before it gets 409 with Retry-After, and never past the
	// request's own deadline (its context's). Negative means not at all.
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
	// What it does not see is a record gone before its expiry: deleted by
	// hand in the database, or lost by the store itself (a failover to an
	// asynchronous replica the completion had not reached). This process
	// may replay such a record for up to MemoryReplayFor after, where a
	// read of the store would have run the request again and so made good
	// what the store lost: on a store that can lose acknowledged writes,
	// turn it off. Defaults to 10s (retries come soon after the first
	// try); negative keeps none, and every duplicate reads the store.
	MemoryReplayFor time.Duration

	// MemoryReplayBytes bounds the memory the answers of MemoryReplayFor
	// take, oldest dropped first; an answer larger than 1/64 of it is not
	// kept (its duplicates read the store). Defaults to 32 MiB.
	MemoryReplayBytes int

	// Clock tells MemoryReplayFor's time, and the lease's between its
	// renewals. Defaults to idem.SystemClock; give it the store's clock
	// when that is not the system's (a test's manual clock). With a store
	// that decides leases by the same clock (idem.LocalClock), a lease
	// counts from when the store began it (see keyed.Config.Clock).
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

// withDefaults returns a copy of cfg with the defaults of the fields the
// engine does not take applied, or an error matching
// idem.ErrInvalidArgument that names the first field refused. New applies
// the engine's (keyed.Config's) and copies them back.
func withDefaults(cfg *Config) (Config, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := *cfg
	if c.Store == nil {
		return Config{}, &idem.ArgumentError{Field: "idemhttp.Config.Store", Reason: "is required"}
	}
	if c.Scope == nil && !c.SharedScope {
		return Config{}, &idem.ArgumentError{Field: "idemhttp.Config.Scope", Reason: "is required: give keys a scope per caller " +
			"(a tenant, an API key), or set SharedScope to share one scope among all callers, replays across callers included"}
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
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
	switch {
	case c.MaxBodyBytes < 0:
		return Config{}, &idem.ArgumentError{Field: "idemhttp.Config.MaxBodyBytes", Reason: "must not be negative"}
	case c.MaxResponseBytes < 0:
		return Config{}, &idem.ArgumentError{Field: "idemhttp.Config.MaxResponseBytes", Reason: "must not be negative"}
	}
	return c, nil
}

// engineConfig is the engine's share of c.
func (c *Config) engineConfig() *keyed.Config {
	return &keyed.Config{Store: c.Store, SeparateTx: c.SeparateTx, TTL: c.TTL, Lease: c.Lease, Timeout: c.Timeout, Holder: c.Holder, Timers: c.Timers, InflightWait: c.InflightWait,
		PollInterval: c.PollInterval, RecentKeys: c.RecentKeys, MemoryReplayFor: c.MemoryReplayFor, MemoryReplayBytes: c.MemoryReplayBytes,
		Clock: c.Clock, KeySecret: c.KeySecret, BodyKeys: c.BodyKeys, DiscardBodies: c.DiscardBodies, Observer: c.Observer, Logger: c.Logger}
}

// applied copies the engine's configuration, its defaults applied, back
// into c.
func (c *Config) applied(e keyed.Config) {
	c.TTL, c.Lease, c.Timeout, c.InflightWait, c.PollInterval = e.TTL, e.Lease, e.Timeout, e.InflightWait, e.PollInterval
	c.Timers = e.Timers
	c.RecentKeys, c.MemoryReplayFor, c.MemoryReplayBytes, c.Clock = e.RecentKeys, e.MemoryReplayFor, e.MemoryReplayBytes, e.Clock
	c.KeySecret, c.Logger = e.KeySecret, e.Logger
}

// renamed is err, an error of keyed.New, naming the field of
// idemhttp.Config it refused.
func renamed(err error) error {
	var ae *idem.ArgumentError
	if errors.As(err, &ae) {
		return &idem.ArgumentError{Field: strings.Replace(ae.Field, "keyed.Config", "idemhttp.Config", 1), Reason: strings.ReplaceAll(ae.Reason, "keyed.Config", "Config")}
	}
	return err
}
