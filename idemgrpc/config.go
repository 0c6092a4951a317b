package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Metadata names.
const (
	// MetadataKey carries the client's idempotency key, the gRPC spelling
	// of HTTP's Idempotency-Key header (metadata names are lower case).
	MetadataKey = "idempotency-key"
	// MetadataReplayed is set to "true" in the header metadata of every
	// replayed answer.
	MetadataReplayed = "idempotent-replayed"
	// MetadataBodyOmitted is set to "true" in the header metadata of a
	// replay whose response was too large to keep (Config.MaxResponseBytes):
	// its message is then empty.
	MetadataBodyOmitted = "idempotent-body-omitted"
)

// Defaults of Config.
const (
	DefaultTTL              = keyed.DefaultTTL
	DefaultLease            = keyed.DefaultLease
	DefaultTimeout          = keyed.DefaultTimeout
	DefaultInflightWait     = keyed.DefaultInflightWait
	DefaultMaxResponseBytes = 1 << 20
)

// Policy says what the interceptor does with a method's calls.
type Policy int

const (
	// Required protects the method: a call without a key is refused with
	// InvalidArgument.
	Required Policy = iota + 1
	// Optional protects the calls that carry a key and lets the others
	// through, unprotected.
	Optional
	// Off lets every call through untouched, with or without a key.
	Off
)

func (p Policy) String() string {
	switch p {
	case Required:
		return "required"
	case Optional:
		return "optional"
	case Off:
		return "off"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Config configures an Interceptor. The zero value of every field but
// Store and Scope (or SharedScope) means its default.
type Config struct {
	// Store keeps the keys. Required. When it implements idem.TxStore and
	// SeparateTx is false, the handler runs inside Store.CompleteTx, so its
	// writes to the store's database and the kept answer commit together,
	// and nothing reaches the client before that commit. When it also
	// implements idem.TxClaimer, the key is claimed in that same
	// transaction (TxClaimer.ClaimTx).
	Store idem.Store

	// SeparateTx forces the two-step form (claim, run, complete) even with a
	// TxStore or TxClaimer. Defaults to false.
	SeparateTx bool

	// Scope returns who owns the call's key (a tenant, an authenticated
	// peer), from the call's context (its metadata, its peer, what an
	// authentication interceptor before this one put there) and its full
	// method name. Keys never cross scopes. An error refuses the call with
	// Unauthenticated and runs nothing; its text is logged, not sent,
	// unless it is a gRPC status error (status.Error), which is sent as it
	// is. An empty scope without an error is refused the same way, unless
	// SharedScope is set too. Required, unless SharedScope says that
	// every caller shares one scope.
	Scope func(ctx context.Context, fullMethod string) (idem.Scope, error)

	// SharedScope puts every call's key in one scope, shared by all
	// callers, when Scope is nil (and lets Scope's empty scope through as
	// that one): a key one caller sent is then the same key
	// for any other, replays included. Set it only for a service with one
	// caller, or whose keys are unguessable and never shared. Defaults to
	// false: New refuses a Config with neither.
	SharedScope bool

	// Methods sets the policy of single methods, by full method name
	// ("/payments.v1.Payments/Create"), or of a whole service
	// ("/payments.v1.Payments/*"); a method's own entry wins over its
	// service's. Mark a method Off to let its calls through without a key
	// (a read, a probe of your own). Defaults to none: every method gets
	// Default, except the health service (grpc.health.v1.Health) and
	// server reflection (grpc.reflection.v1.ServerReflection and
	// v1alpha's), which are Off unless named here, so that adding the
	// interceptor to a server keeps its health probes and grpcurl working.
	// New refuses a name of neither form ("/payments.v1.Payments.Create",
	// "/payments.v1.Payments/"), which no call could match.
	Methods map[string]Policy

	// Default is the policy of the methods Methods does not name, beside
	// health and reflection (Off). Defaults to Required, except for
	// methods whose descriptor, in the protobuf registry, declares
	// idempotency_level NO_SIDE_EFFECTS or IDEMPOTENT: they are safe to run
	// twice by their own contract, and default to Off.
	Default Policy

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
	// finish before it is answered Aborted, with a RetryInfo. Negative means
	// not at all. Defaults to 5s, or less when the call's deadline is
	// sooner: a duplicate never waits past its own deadline.
	InflightWait time.Duration

	// PollInterval is the longest a waiting duplicate goes without asking
	// the store again, for changes made by other processes when the store
	// is not an idem.Waiter. Defaults to 250ms.
	PollInterval time.Duration

	// Keep decides, from the handler's status code, whether an answer is
	// kept and replayed (a deterministic outcome) or the key released so a
	// retry runs again. Defaults to DefaultKeep.
	Keep func(fullMethod string, code codes.Code) bool

	// MaxResponseBytes caps the response encoding kept for replay. Defaults
	// to 1 MiB. A larger response is never silently truncated:
	//   - in the same-transaction forms the transaction is rolled back, the
	//     key released, and the caller gets Internal (ReasonResponseTooLarge);
	//   - otherwise the effect has happened: the caller gets the whole
	//     response, and the key is completed with the status and metadata
	//     but no message; replays then carry idempotent-body-omitted: true
	//     and an empty message, as idemhttp's carry Idempotent-Body-Omitted.
	MaxResponseBytes int

	// ReplayMetadata are the header and trailer metadata names whose values
	// the handler set (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer)
	// that are kept and replayed with the answer. Nothing else is: metadata
	// often carries what is about one call only (a trace, a server's
	// timing). Names are compared in lower case. Defaults to none.
	ReplayMetadata []string

	// RecentKeys is how many keys the interceptor remembers having seen
	// completed in this process, as idemhttp.Config.RecentKeys: a
	// duplicate of one is answered with one read of the store
	// (idem.Replayer's Replay where the store has it, Store.Get
	// otherwise), without claiming it. Defaults to 65,536; negative
	// remembers none.
	RecentKeys int

	// MemoryReplayFor is how long after a completion this process keeps
	// the answer of one of its RecentKeys in memory, and answers its
	// duplicates from there with no read of the store, as
	// idemhttp.Config.MemoryReplayFor (which says why that is the answer
	// the store would give). Defaults to 10s; negative keeps none.
	MemoryReplayFor time.Duration

	// MemoryReplayBytes bounds the memory the answers of MemoryReplayFor
	// take, oldest dropped first. Defaults to 32 MiB.
	MemoryReplayBytes int

	// Clock tells MemoryReplayFor's time, and the lease's between its
	// renewals. Defaults to idem.SystemClock; give it the store's clock
	// when that is not the system's. With a store that decides leases by
	// the same clock (idem.LocalClock), a lease counts from when the store
	// began it (see keyed.Config.Clock).
	Clock idem.Clock

	// KeySecret, when set, seals every key before the store sees it, as
	// idemhttp.Config.KeySecret does (keyed.SealKey): the store keeps an
	// HMAC of the scope and the key, never the key. At least
	// keyed.MinKeySecretLen bytes, the same for every replica. Defaults
	// to none.
	KeySecret []byte

	// BodyKeys, when set, encrypt what a kept answer says beyond its code
	// (AES-256-GCM, bound to its record's scope and key), as
	// idemhttp.Config.BodyKeys does: the response message, the status
	// message and details, and the replayed metadata (ReplayMetadata) are
	// kept together in the sealed body, never in the record's headers,
	// which every store keeps in clear. The first key seals; every key
	// opens. Recovery points are sealed with them too. Defaults to none.
	BodyKeys []keyed.BodyKey

	// DiscardBodies keeps only the code and the replayed metadata of an
	// answer (in clear, unless BodyKeys are set too), never its message,
	// status message or details: a replay of an OK answer is then an empty
	// message marked idempotent-body-omitted, and a replay of a refusal its
	// code with no message. Defaults to false.
	DiscardBodies bool

	// Observer sees the phases of every protected call (claim, handler,
	// complete, replay) and every round trip to the store: it is the
	// engine's (keyed.Observer, which idemhttp.Observer names too), so
	// idemprom's MiddlewareObserver and idemotel's observer work unchanged. An Event's Request describes the call as the
	// HTTP/2 request it is (POST to the full method name, Content-Type
	// application/grpc), and its Status is the HTTP status gRPC's code maps
	// to (HTTPStatus). Defaults to nil: nothing is observed, at no cost.
	Observer keyed.Observer

	// Logger receives one record per protected call that did not simply
	// run or replay, and the errors that clients are not shown. Keys are
	// logged as idem.KeyDigest of their scope and key, never as they are.
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

// DefaultKeep keeps the answers a handler decides from the request and
// the state it finds, which a retry would get again: OK, InvalidArgument,
// NotFound, AlreadyExists, PermissionDenied, FailedPrecondition and
// OutOfRange. Every other code is transient, and keeps nothing: Canceled,
// DeadlineExceeded, Unavailable, ResourceExhausted, Aborted (each asks for
// a retry by definition), Unknown, Internal, DataLoss (a server's failure,
// HTTP's 5xx), Unimplemented (a server not yet upgraded) and
// Unauthenticated (the client refreshes its credentials and retries).
func DefaultKeep(_ string, code codes.Code) bool {
	switch code {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
		codes.PermissionDenied, codes.FailedPrecondition, codes.OutOfRange:
		return true
	}
	return false
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
		return Config{}, &idem.ArgumentError{Field: "idemgrpc.Config.Store", Reason: "is required"}
	}
	if c.Scope == nil && !c.SharedScope {
		return Config{}, &idem.ArgumentError{Field: "idemgrpc.Config.Scope", Reason: "is required: give keys a scope per caller " +
			"(a tenant, an authenticated peer), or set SharedScope to share one scope among all callers, replays across callers included"}
	}
	if c.Keep == nil {
		c.Keep = DefaultKeep
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.MaxResponseBytes < 0 {
		return Config{}, &idem.ArgumentError{Field: "idemgrpc.Config.MaxResponseBytes", Reason: "must not be negative"}
	}
	if err := checkDefault("idemgrpc.Config.Default", c.Default); err != nil {
		return Config{}, err
	}
	if err := checkMethods("idemgrpc.Config.Methods", c.Methods); err != nil {
		return Config{}, err
	}
	return c, nil
}

// checkDefault refuses a Default (Config's or Client's, named by field)
// that is neither unset nor a Policy.
func checkDefault(field string, def Policy) error {
	if def != 0 && (def < Required || def > Off) {
		return &idem.ArgumentError{Field: field, Reason: fmt.Sprintf("is %s, not a Policy", def)}
	}
	return nil
}

// checkMethods refuses a Methods map (Config's or Client's, named by
// field) that gives a name something other than a Policy, or that holds a
// name no call can have: an entry that matches no call would leave its
// policy silently not applied. Its names are read in order, so that the
// entry named is the same on every run.
func checkMethods(field string, methods map[string]Policy) error {
	for _, name := range slices.Sorted(maps.Keys(methods)) {
		if p := methods[name]; p < Required || p > Off {
			return &idem.ArgumentError{Field: field, Reason: fmt.Sprintf("gives %q %s, not a Policy", name, p)}
		}
		// A service holding a slash ("/a.B/C/D" splits as service "a.B/C")
		// is none a .proto can declare: the full methods of generated code
		// hold exactly two slashes, so such a name matches no call.
		if service, _, ok := splitMethod(name); !ok || strings.Contains(service, "/") {
			return &idem.ArgumentError{Field: field, Reason: fmt.Sprintf("names %q: want /package.Service/Method or /package.Service/*", name)}
		}
	}
	return nil
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
// idemgrpc.Config it refused.
func renamed(err error) error {
	var ae *idem.ArgumentError
	if errors.As(err, &ae) {
		return &idem.ArgumentError{Field: strings.Replace(ae.Field, "keyed.Config", "idemgrpc.Config", 1), Reason: strings.ReplaceAll(ae.Reason, "keyed.Config", "Config")}
	}
	return err
}
