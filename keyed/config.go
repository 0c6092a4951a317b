package keyed

import (
	"bytes"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
)

// Defaults of Config.
const (
	DefaultTTL          = 24 * time.Hour
	DefaultLease        = 10 * time.Second
	DefaultTimeout      = time.Minute
	DefaultInflightWait = 5 * time.Second
)

// Config configures an Engine. The zero value of every field but Store
// means its default. A face's own Config (idemhttp's, idemgrpc's) has the
// same fields and passes them on.
type Config struct {
	// Store keeps the keys. Required. When it implements idem.TxStore and
	// SeparateTx is false, the handler runs inside Store.CompleteTx, so its
	// writes to the store's database and the kept answer commit together,
	// and nothing reaches the client before that commit. When it also
	// implements idem.TxClaimer, the key is claimed in that same
	// transaction (TxClaimer.ClaimTx), unless it writes serially
	// (idem.SerialWriter: idemsqlite), where that transaction would hold
	// the only writer through whatever the handler does before it writes;
	// there the key is claimed with one short write first.
	Store idem.Store

	// SeparateTx forces the two-step form (claim, run, complete) even with a
	// TxStore or TxClaimer. Defaults to false.
	SeparateTx bool

	// TTL is how long a key is remembered from its claim. Defaults to 24h.
	TTL time.Duration

	// Lease is how long an execution holds its key, past its last renewal,
	// before a retry may take it over: how soon the key of a holder that
	// died (a crash, a lost machine) is free again. A running execution
	// renews its lease every third of it (idem.Store.Renew), so a live one
	// keeps its key however long it runs (up to Timeout), and one that
	// cannot renew it before it ends (the store unreachable) has its
	// context cancelled, so that it stops before another takes over; its
	// late completion is refused (fencing). Defaults to 10s, or TTL when
	// that is shorter.
	Lease time.Duration

	// Timeout bounds one execution of the handler: its context ends then,
	// whatever the lease, which is renewed until it does. Defaults to 1m.
	Timeout time.Duration

	// Holder names this process as the holder of the keys it claims: a
	// replica (a name it keeps when it restarts) and its incarnation (new
	// at every start). With a store that keeps holders (idem.Restarter),
	// Engine.Restart ends at once the leases an earlier incarnation of the
	// replica held when it died. Defaults to none: claims are anonymous.
	Holder idem.Holder

	// Timers schedule the lease's renewals. Defaults to idem.RuntimeTimers;
	// a test that drives Clock by hand gives the same clock here (an
	// idemmem.Clock is both), so that moving it renews.
	Timers idem.Timers

	// InflightWait is how long a duplicate waits for the execution in
	// flight to finish before it is refused (RefusedInFlight), and never
	// past the caller's own deadline. Negative means not at all. Defaults
	// to 5s.
	InflightWait time.Duration

	// PollInterval is the longest a waiting duplicate goes without asking
	// the store again, for changes made by other processes when the store
	// is not an idem.Waiter. Defaults to 250ms.
	PollInterval time.Duration

	// RecentKeys is how many keys the engine remembers having seen
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

	// Clock tells MemoryReplayFor's time, the Completer's, and the lease's
	// between its renewals. Defaults to idem.SystemClock; give it the
	// store's clock when that is not the system's (a test's manual clock).
	// When the store decides leases by this very clock (idem.LocalClock:
	// idemsqlite, idemmem, given the same Clock or both the default), a
	// lease counts from when the store began it, by the end the store
	// reports; otherwise from when its claim or renewal was sent.
	Clock idem.Clock

	// KeySecret, when set, seals every key before the store sees it: the
	// store keeps SealKey(KeySecret, scope, key), an HMAC-SHA-256 digest,
	// never the key a client sent, so a dump of the store does not show
	// them. Execution.Key is then the sealed key, which is what an effect
	// should record. At least MinKeySecretLen bytes, random, the same for
	// every replica, and kept out of the store. Changing it makes every key
	// kept under the old one unknown (their duplicates run again).
	// Defaults to none: keys are kept as they are.
	KeySecret []byte

	// BodyKeys, when set, encrypt the bodies kept for replay (AES-256-GCM,
	// bound to their record's scope and key). The first key seals; every
	// key opens, so a new key goes first and an old one stays until the
	// TTL has passed since it last sealed. A body kept before BodyKeys was
	// set is replayed as it is. Defaults to none: bodies are kept as the
	// handler wrote them.
	BodyKeys []BodyKey

	// DiscardBodies keeps only the status and the replayed headers of an
	// answer, never its body: a replay says its body was omitted. Defaults
	// to false.
	DiscardBodies bool

	// Observer sees the phases of every request (claim, handler, complete,
	// replay) and every round trip to the store, for tracing and latency
	// histograms: see package idemotel for OpenTelemetry spans and idemprom
	// for Prometheus histograms, and Observers to have both. Defaults to
	// nil: nothing is observed, at no cost.
	Observer Observer

	// Logger receives one record per request that did not simply run or
	// replay, and the errors that clients are not shown. Keys are logged
	// as idem.KeyDigest of their scope and key, never as they are.
	// Defaults to a logger that discards.
	Logger *slog.Logger
}

// Defaults of the fields without a constant of their own.
const (
	defaultPollInterval      = 250 * time.Millisecond
	defaultRecentKeys        = 1 << 16
	defaultMemoryReplayFor   = 10 * time.Second
	defaultMemoryReplayBytes = 32 << 20
)

// withDefaults returns a copy of cfg with the defaults applied, or an
// error matching idem.ErrInvalidArgument that names the first field
// refused.
func withDefaults(cfg *Config) (Config, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	const prefix = "keyed.Config"
	refuse := func(field, reason string) (Config, error) {
		return Config{}, &idem.ArgumentError{Field: prefix + "." + field, Reason: reason}
	}
	c := *cfg
	if c.Store == nil {
		return refuse("Store", "is required")
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
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Timers == nil {
		c.Timers = idem.RuntimeTimers{}
	}
	if c.PollInterval == 0 {
		c.PollInterval = defaultPollInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.TTL < 0:
		return refuse("TTL", "must not be negative")
	case c.Lease < 0:
		return refuse("Lease", "must not be negative")
	case c.TTL < c.Lease:
		return refuse("TTL", fmt.Sprintf("(%s) must not be shorter than %s.Lease (%s)", c.TTL, prefix, c.Lease))
	case c.PollInterval < 0:
		return refuse("PollInterval", "must not be negative")
	case c.Timeout < 0:
		return refuse("Timeout", "must not be negative")
	}
	if err := c.Holder.Validate(); err != nil {
		return refuse("Holder", err.Error())
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
		return refuse("MemoryReplayBytes", "must not be negative")
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.KeySecret != nil && len(c.KeySecret) < MinKeySecretLen {
		return refuse("KeySecret", fmt.Sprintf("is %d bytes; at least %d are needed", len(c.KeySecret), MinKeySecretLen))
	}
	c.KeySecret = bytes.Clone(c.KeySecret)
	if _, err := newBodySealer(c.BodyKeys); err != nil {
		return refuse("BodyKeys", err.Error())
	}
	return c, nil
}
