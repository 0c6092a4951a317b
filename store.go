package idem

import (
	"context"
	"net/http"
	"time"
	"unicode/utf8"
)

// Token is a fencing token: it identifies one holder of a key's lease. Every
// successful Claim of a key returns a token greater than any token issued for
// that key before, so a holder whose lease was taken over can be told apart
// from the new holder, and its late Complete or Release is refused.
type Token int64

// State is the state of a Record.
type State int

const (
	// StateInFlight means a holder has claimed the key and has not yet
	// completed or released it.
	StateInFlight State = iota + 1
	// StateCompleted means the holder completed the key; the record holds the
	// response every duplicate gets.
	StateCompleted
)

func (s State) String() string {
	switch s {
	case StateInFlight:
		return "in_flight"
	case StateCompleted:
		return "completed"
	default:
		return "unknown"
	}
}

// Response is what a Store keeps of the first execution's answer, to be
// replayed to every duplicate.
type Response struct {
	// Status is the HTTP status code (or, outside HTTP, any code the caller
	// gives it meaning).
	Status int
	// Header holds the headers to replay. Callers filter it before storing:
	// a Store keeps what it is given.
	Header http.Header
	// Body is the response body. It is empty when BodyOmitted is set.
	Body []byte
	// BodyOmitted reports that the body was too large to keep, so a replay
	// can say so instead of sending an empty body as if it were the answer.
	BodyOmitted bool
}

// Record is one idempotency key as a Store keeps it.
type Record struct {
	Scope       Scope
	Key         Key
	Fingerprint Fingerprint
	State       State
	// Token is the fencing token of the current (or last) holder.
	Token Token
	// Response is set when State is StateCompleted.
	Response *Response
	// CreatedAt is when the key was (last) claimed anew. A takeover keeps
	// it, so (Scope, Key, CreatedAt) names one generation of a key: every
	// execution of one logical request, and nothing after the key expired
	// and was claimed again.
	CreatedAt time.Time
	// LeaseExpiresAt is when an in-flight holder's lease ends; after it a
	// Claim with the same fingerprint takes the key over with a new token.
	LeaseExpiresAt time.Time
	// ExpiresAt is when the record stops counting: after it the key can be
	// claimed anew and Purge may delete the record.
	ExpiresAt time.Time
	// CompletedAt is when the record was completed; zero while in flight.
	CompletedAt time.Time
	// Holder is who claimed the key last (the claim, or the takeover, that
	// gave it its current token), as ClaimRequest.Holder said; zero for an
	// anonymous claim, or a store that keeps no holders (see Restarter). A
	// completion keeps it.
	Holder Holder
	// Recovery is the last recovery point an execution saved (see
	// Recoverer); zero when none was, or the store keeps none. A
	// completion keeps it, for the record's history.
	Recovery RecoveryPoint
}

// Outcome says what a Claim found.
type Outcome int

const (
	// Acquired: the caller now holds the key, under Claim.Token, until
	// Claim.Record.LeaseExpiresAt. It must Complete or Release it.
	Acquired Outcome = iota + 1
	// InFlight: another holder has the key and its lease is live. The caller
	// must not run the effect; it may wait and claim again.
	InFlight
	// Completed: the key was completed; Claim.Record.Response is the stored
	// answer to replay.
	Completed
	// Mismatch: the key exists (in flight or completed) with a different
	// fingerprint. The request is a client bug or an attack and is refused.
	Mismatch
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case InFlight:
		return "in_flight"
	case Completed:
		return "completed"
	case Mismatch:
		return "mismatch"
	default:
		return "unknown"
	}
}

// ClaimRequest is the argument of Store.Claim.
type ClaimRequest struct {
	Scope       Scope
	Key         Key
	Fingerprint Fingerprint
	// Lease is how long the claimant holds the key before another claimant
	// with the same fingerprint may take it over. Must be positive.
	Lease time.Duration
	// TTL is how long the record lives, counted from the claim. Must be
	// positive.
	TTL time.Duration
	// Unseen says the caller has seen no sign of the key (a middleware
	// that saw it neither completed lately nor in flight): most likely a
	// new key. A store may then claim at once, without first reading the
	// record where a read is cheaper than a claim (idemsqlite reads from
	// its read pool first otherwise). The outcome is the same either way.
	Unseen bool
	// Holder says who claims: a replica and one run of its process. The
	// record keeps it while the claim holds the key (Record.Holder), so
	// that a replica that restarts can end at once the leases its earlier
	// run held (Restarter). Zero: anonymous, as every claim was before.
	Holder Holder
}

// Validate reports whether the request is well formed, naming what is not.
func (r ClaimRequest) Validate() error {
	switch {
	case r.Key == "":
		return &ArgumentError{Field: "Key", Reason: "must not be empty"}
	case r.Fingerprint == "":
		return &ArgumentError{Field: "Fingerprint", Reason: "must not be empty"}
	case r.Lease <= 0:
		return &ArgumentError{Field: "Lease", Reason: "must be positive"}
	case r.TTL <= 0:
		return &ArgumentError{Field: "TTL", Reason: "must be positive"}
	case r.TTL < r.Lease:
		return &ArgumentError{Field: "TTL", Reason: "must not be shorter than Lease"}
	}
	return r.Holder.validate("Holder")
}

// Holder names who holds a key: a replica (a process of a service, under a
// name that stays the same when it restarts: a host or pod name, or
// idem serve's --replica-id) and its incarnation (one run of that
// process, different every time it starts: its start time with some
// randomness, say). The zero Holder is anonymous. A Holder is zero or has
// both parts.
//
// Two processes that run at once must never share a Replica: each takes
// the other for its own dead incarnation (Restarter.YieldEarlier).
type Holder struct {
	Replica     string
	Incarnation string
}

// MaxHolderLen is the longest Replica or Incarnation every store accepts,
// in bytes.
const MaxHolderLen = 200

// IsZero reports whether h is anonymous.
func (h Holder) IsZero() bool { return h == Holder{} }

// String returns "replica/incarnation", or "" for the zero Holder.
func (h Holder) String() string {
	if h.IsZero() {
		return ""
	}
	return h.Replica + "/" + h.Incarnation
}

// Validate reports whether h can be given with a claim: zero, or both
// parts non-empty, at most MaxHolderLen bytes of UTF-8 each, with no
// control characters.
func (h Holder) Validate() error { return h.validate("Holder") }

func (h Holder) validate(field string) error {
	if h.IsZero() {
		return nil
	}
	for _, p := range []struct{ name, v string }{{".Replica", h.Replica}, {".Incarnation", h.Incarnation}} {
		switch {
		case p.v == "":
			return &ArgumentError{Field: field + p.name, Reason: "must not be empty when the other part is set"}
		case len(p.v) > MaxHolderLen:
			return &ArgumentError{Field: field + p.name, Reason: "must be at most 200 bytes"}
		case !utf8.ValidString(p.v):
			return &ArgumentError{Field: field + p.name, Reason: "must be valid UTF-8"}
		}
		for _, c := range p.v {
			if c < 0x20 || c == 0x7f {
				return &ArgumentError{Field: field + p.name, Reason: "must not contain control characters"}
			}
		}
	}
	return nil
}

// Claim is the result of Store.Claim.
type Claim struct {
	Outcome Outcome
	// Token is the caller's fencing token when Outcome is Acquired; zero
	// otherwise.
	Token Token
	// Record is the key's record as the claim left it (Acquired) or found it.
	Record Record
	// TookOver reports, with Acquired, that the key was in flight under an
	// expired lease and the caller took it over: an earlier holder may have
	// crashed in the middle of the effect.
	TookOver bool
}

// Ref names one held key: the scope, the key and the holder's token.
type Ref struct {
	Scope Scope
	Key   Key
	Token Token
}

// Store keeps idempotency records. Implementations are safe for concurrent
// use by many goroutines and, where the backend is shared, by many processes.
//
// Time: a Store decides lease and TTL expiry by its own clock (an injected
// Clock for embedded stores, the server's clock for shared ones), never by
// the caller's.
//
// Ambiguous failures: when a method returns an error other than the
// sentinel errors documented for it, the caller cannot know whether the
// change was made (the write may have committed and only its
// acknowledgement was lost). Each method says what the caller may then do.
type Store interface {
	// Claim atomically claims req.Key within req.Scope, or reports why it
	// cannot. Exactly one of any number of concurrent callers gets Acquired
	// for a free key. An absent or expired key is claimed anew; an in-flight
	// key whose lease ended is taken over (Acquired, TookOver, new token)
	// when the fingerprint matches. A fingerprint that differs from the
	// record's gives Mismatch, whatever the record's state.
	//
	// Returns an *ArgumentError (matching ErrInvalidArgument) for a malformed
	// request, having changed nothing. On any other error the claim may or
	// may not have been made: the caller must not run the effect. Claiming
	// again is safe; if the lost claim was made, the retry sees InFlight
	// until that lease ends, then takes the key over.
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)

	// Complete stores resp as the key's answer and marks it completed, if
	// ref.Token still holds the key. Completing again with the same token
	// and a completed record succeeds without change, so a retry after an
	// ambiguous failure is safe.
	//
	// Returns ErrLeaseLost when the key is held under another token, was
	// released, or expired and was claimed anew: the caller's effect raced
	// with another holder's and nothing was stored.
	Complete(ctx context.Context, ref Ref, resp Response) error

	// Release gives up the key without storing an answer, so the next Claim
	// runs the effect again. Releasing a key that is already gone succeeds,
	// so a retry after an ambiguous failure is safe.
	//
	// Returns ErrLeaseLost when the key is held under another token or was
	// completed. A Recoverer returns ErrHasRecoveryPoint for a key in flight
	// with a recovery point, and changes nothing: see
	// Recoverer.ReleaseWithPoint.
	Release(ctx context.Context, ref Ref) error

	// Renew extends the lease ref.Token holds on the key so that it ends
	// lease from now, by the store's clock, and returns the new lease end
	// (which replaces the old one, earlier or later). It is one round trip
	// and is fenced by ref.Token. A holder whose work may outlast its lease
	// renews it while it works (every third of the lease, say), so that a
	// short lease ends early only for a holder that died.
	//
	// A holder whose lease ended but whom nobody took over still holds the
	// key (Complete accepts it), so its renewal succeeds and gives it a live
	// lease again. A record whose TTL would end before the new lease end
	// has its expiry (Record.ExpiresAt) moved to the lease end, so a key in
	// flight never expires under a live holder.
	//
	// Returns an *ArgumentError for a lease that is not positive, and
	// ErrLeaseLost when ref.Token does not hold the key in flight (it was
	// completed, released, taken over, or expired and claimed anew), having
	// changed nothing. On any other error the lease may or may not have been
	// renewed; renewing again is safe.
	Renew(ctx context.Context, ref Ref, lease time.Duration) (time.Time, error)

	// Get returns the key's record. Returns ErrNotFound when there is none
	// or it has expired.
	Get(ctx context.Context, scope Scope, key Key) (Record, error)

	// Purge deletes at most limit records whose TTL has passed and that no
	// live lease holds, and returns how many it deleted. A small limit keeps
	// each call short, so purging never blocks claims for long; call it
	// until it returns fewer than limit. An error may follow a partial purge;
	// calling again is safe.
	Purge(ctx context.Context, limit int) (int, error)
}

// TxWork is the caller's effect, run by TxStore.CompleteTx inside the
// store's transaction. The context it receives carries the transaction (each
// store documents how to reach it). It returns the answer to keep and
// whether to keep it: keep=false, or a non-nil error, rolls the whole
// transaction back.
type TxWork func(ctx context.Context) (resp Response, keep bool, err error)

// TxStore is a Store whose records live in the same database as the
// caller's own data, so that the effect and the key's completion commit in
// one transaction: a crash can never leave "charged but not recorded" nor
// "recorded but not charged".
type TxStore interface {
	Store

	// CompleteTx runs work inside one transaction and, when work returns
	// keep=true and no error, completes ref with the response in that same
	// transaction and commits. When work returns keep=false or an error, or
	// the completion is refused, everything work wrote is rolled back and
	// the key stays claimed: the caller then releases it.
	//
	// Returns work's error unchanged; ErrLeaseLost (the effect was rolled
	// back) when ref.Token no longer holds the key. On any other error the
	// commit may or may not have happened (a lost acknowledgement): the key
	// must not be released; Get tells which it was.
	CompleteTx(ctx context.Context, ref Ref, work TxWork) (kept bool, err error)
}

// ClaimedWork is the caller's effect, run by TxClaimer.ClaimTx inside the
// transaction that claimed the key: as TxWork, with the claim it runs under.
type ClaimedWork func(ctx context.Context, claim Claim) (resp Response, keep bool, err error)

// TxClaimer is a TxStore that can claim a key in the very transaction that
// runs the effect and completes the key: the claim, the effect and the
// completion commit together, or none of them does. No other transaction
// ever sees the key in flight, so a crash or a rollback leaves the key as
// it was before the claim, with nothing to release and no lease to wait
// out; and the first execution of a key costs one transaction, not two.
//
// A concurrent claim of a key whose claiming transaction has not ended
// waits for that transaction, and then answers as the key is: completed
// (the duplicate replays the answer) or free again (the duplicate runs).
// That wait holds a database connection: it is what the first execution's
// transaction costs its duplicates.
type TxClaimer interface {
	TxStore

	// ClaimTx begins a transaction and claims req in it. When the claim
	// acquires the key, ClaimTx runs work in that transaction with the
	// claim and, when work returns keep=true and no error, completes the
	// key with work's response and commits, as CompleteTx does. When work
	// returns keep=false or an error, or panics, everything is rolled back,
	// the claim included: the key is as it was, and must not be released.
	//
	// When the claim does not acquire the key, ClaimTx returns it
	// (Completed, Mismatch or InFlight) without running work. A key held by
	// another ClaimTx that is still running is waited for, at most wait
	// (at least a millisecond), and then answered InFlight with a Record
	// that carries only its Scope, Key and State.
	//
	// Errors: with claim.Outcome Acquired, those of CompleteTx (work's
	// error unchanged; ErrLeaseLost; a failed commit, which may have
	// committed). With any other claim, the claim itself failed, nothing
	// ran, and claiming again is safe.
	ClaimTx(ctx context.Context, req ClaimRequest, wait time.Duration, work ClaimedWork) (claim Claim, kept bool, err error)
}

// SerialWriter is a TxStore whose database runs one write transaction at
// a time (SQLite: one writer per file). There, a transaction open while its
// caller does something slow before writing (a validation, a call to
// another service, a lock wait) makes every other write wait that long, and
// a TxClaimer's ClaimTx holds its transaction from the claim to the commit,
// whatever the work does in between. A caller that cannot tell how long its
// work takes before it writes (idemhttp cannot) therefore claims with
// Claim, one short write, and runs the work in CompleteTx, which a
// SerialWriter begins only at the work's first write: the key's completion
// still commits with the work's writes, and the writer is held only while
// they are made.
type SerialWriter interface {
	TxStore

	// WritesSerially reports whether the store's write transactions run one
	// at a time. A wrapper of a store forwards its answer.
	WritesSerially() bool
}

// LocalClock is a Store that decides its leases by a Clock of this process
// (an embedded store: idemsqlite, idemmem), where a shared store decides
// them by its server's. A lease end it reports (Claim.Record.LeaseExpiresAt
// with Acquired, Renew's) is then a time on that Clock, which a caller that
// tells the time by the same Clock may count its lease to: a claim that
// waited long before the store ran it (queued behind SQLite's one writer)
// returns with its whole lease left, which a caller counting from when it
// sent the claim would think mostly gone. The store decides a lease by the
// wall-clock reading of the Clock's times, not by a monotonic reading
// (which a kept time loses), and the caller counts the lease on the wall
// clock too, so that a step of the wall clock moves both alike. A wrapper
// of a store forwards it only when the lease ends it reports are the
// store's, unchanged.
type LocalClock interface {
	Store

	// LeaseClock returns the Clock the store decides leases by.
	LeaseClock() Clock
}

// Replayer is a Store that answers the duplicate of a completed key with
// one read of only what the answer needs: the kept response, and whether
// the duplicate is the same request. idemhttp uses it, when the store
// offers it, for the keys it saw completed lately (Config.RecentKeys),
// where Get would read the whole record.
type Replayer interface {
	Store

	// Replay returns the response kept for key when its record is
	// completed and live (its TTL has not passed, as Get judges it) and
	// its fingerprint is fp. When such a record has another fingerprint,
	// it returns mismatch true and no response. Otherwise (no record, a
	// key in flight, an expired record) it returns neither, and the caller
	// claims the key as it would have. It never writes. Called with a
	// context that carries a transaction of the store's database, it reads
	// in that transaction, as Get does.
	Replay(ctx context.Context, scope Scope, key Key, fp Fingerprint) (resp *Response, mismatch bool, err error)
}

// Restarter is a Store that keeps the Holder of each key in flight, so
// that a replica that restarts can take back at once what its earlier
// incarnation held when it died: that process is certainly dead, and its
// keys need not wait out their leases.
type Restarter interface {
	Store

	// YieldEarlier ends at once the lease of every key in flight whose
	// holder is current.Replica under an incarnation other than
	// current.Incarnation, as Recoverer.Yield does for one key, and returns
	// how many leases it ended (a key whose lease had ended already is not
	// counted). Each key stays in flight with its token and its recovery
	// point, if any; the next Claim with its fingerprint takes it over at
	// once, and a Recoverer lists it in Abandoned when it has a point. The
	// keys' waiters wake, as a Yield's do. A replica calls it as it
	// starts, with the Holder its claims give from then on.
	//
	// It never touches a key held by another replica, by current itself,
	// or anonymously, nor a completed key.
	//
	// Returns an *ArgumentError when current is zero or malformed, having
	// changed nothing. On any other error some of the leases may have
	// ended; calling again is safe, and ends the rest.
	YieldEarlier(ctx context.Context, current Holder) (int, error)
}

// Waiter is implemented by stores that can tell a waiting duplicate when a
// key may have changed, so it need not poll tightly.
type Waiter interface {
	// WaitChange returns when the key may have changed state (completed,
	// released or taken over), when ctx is done, or at the store's own
	// discretion; the caller then claims again. Spurious returns are allowed.
	WaitChange(ctx context.Context, scope Scope, key Key) error
}
