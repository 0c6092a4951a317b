package keyed

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// Request is what a face read from one request: whose key it is, the key,
// and what the request is (its fingerprint).
type Request struct {
	// Scope is who owns the key (a tenant, an API key): keys never cross
	// scopes.
	Scope idem.Scope
	// Key is the key as the client sent it (idem.ParseKey's). The engine
	// seals it with Config.KeySecret before anything else sees it.
	Key idem.Key
	// Fingerprint identifies the request (idem.NewFingerprint): the same
	// key with another fingerprint is refused (RefusedMismatch).
	Fingerprint idem.Fingerprint
	// Method and Path name the request in the engine's log records, as
	// "method" and "path" ("POST" and "/v1/payments"; idemgrpc gives the
	// full method name as Method, and no Path). Either may be empty.
	Method, Path string
}

// Face is what a face supplies for one request: how its handler runs and
// how an answer reaches its client. The engine calls Run at most once, and
// then exactly one of Send, Replay (followed by Refuse when Replay fails)
// or Refuse, before Serve returns; all on Serve's goroutine, except Run,
// which a store's transaction may run on its own (it returns before Serve
// does).
type Face interface {
	// Run runs the application's handler once, with ctx, and reports what
	// it did. ctx carries the Execution (ExecutionFromContext), and in the
	// same-transaction forms the store's transaction; it ends when the
	// execution's time is up. inTx says that the handler runs inside the
	// store's transaction: nothing may reach the client until Send, so the
	// answer is captured whole (past the face's limit, Ran.Overflow).
	// Otherwise the face may let a long answer through as it is written;
	// the face then knows that its client has part of the answer, and
	// speaks what follows accordingly. Run must not panic: a panic of the
	// handler is a Ran.Failure, which the face may raise again once Serve
	// has returned (idemgrpc does; idemhttp raises http.ErrAbortHandler
	// alone).
	Run(ctx context.Context, inTx bool) Ran
	// Send answers with what Run's handler answered.
	Send()
	// Replay answers with a kept answer, its body opened. It returns an
	// error when the face cannot read the answer (it was not kept by this
	// face, say); the engine then counts a store error and calls Refuse
	// with RefusedUnreadable. Nothing must have reached the client then.
	Replay(resp *idem.Response) error
	// Refuse answers with one of the engine's refusals, in the face's
	// words (problem+json, a gRPC status).
	Refuse(r Refusal)
}

// Ran is what a face's handler did, as Face.Run reports it.
type Ran struct {
	// Status is the answer's status on HTTP's scale (a face of another
	// protocol maps its codes onto it, as idemgrpc.HTTPStatus does): what
	// observers see and log records say.
	Status int
	// Failure says that the handler gave no answer: "panicked", "timed
	// out", "was aborted". Nothing is kept; the key is released (or, with
	// a recovery point, yielded). Empty when the handler answered.
	Failure string
	// Crashed, with Failure, says that the handler ended as a crash of its
	// process would (net/http's http.ErrAbortHandler): how far its effect
	// got is unknown, so outside a shared transaction its key is left in
	// flight until its lease ends (OutcomeAborted), as a crash leaves it,
	// rather than released for a retry to run at once.
	Crashed bool
	// Keep says that the answer is deterministic, to be kept and replayed
	// (the face's Keep rule: a 2xx–4xx, an OK or FailedPrecondition);
	// false releases the key so that a retry runs again.
	Keep bool
	// Answer is what is kept when Keep is set: the status, the headers to
	// replay (the face filters them), and the body as the handler wrote it
	// (the engine seals or drops it: Config.BodyKeys, DiscardBodies). The
	// engine may keep its header map and body as they are: the face must
	// not change them once Run has returned.
	Answer idem.Response
	// Overflow says that the body exceeded what the face keeps. Inside the
	// store's transaction the engine then rolls everything back, releases
	// the key and refuses with RefusedTooLarge; otherwise the effect has
	// happened, the client gets the whole answer (Send), and the answer is
	// kept without its body (idem.Response.BodyOmitted).
	Overflow bool
	// Err says that the answer could not be made into an idem.Response
	// (idemgrpc: a response that is not a protocol buffer message). Inside
	// the store's transaction everything is rolled back, the key released,
	// and the engine refuses with RefusedUnkeepable; otherwise the client
	// gets the answer (Send), and the key stays in flight until its lease
	// ends (OutcomeStoreError).
	Err error
}

// Reason names one of the engine's refusals.
type Reason uint8

// Refusals. Each says what the client is told, on idemhttp and on
// idemgrpc (see the table in the package's documentation).
const (
	// RefusedMismatch: the key was used with another request (Refusal.State
	// says whether that one is finished). HTTP 422; FailedPrecondition.
	RefusedMismatch Reason = iota + 1
	// RefusedInFlight: an execution of the key was still in flight when
	// the duplicate's wait ended (InflightWait, or the caller's deadline,
	// or the caller left). HTTP 409 with Retry-After; Aborted with a
	// RetryInfo.
	RefusedInFlight
	// RefusedStoreUnavailable: the key could not be claimed; nothing ran.
	// HTTP 503 with Retry-After; Unavailable with a RetryInfo.
	RefusedStoreUnavailable
	// RefusedCommitFailed: the store's transaction, the handler's writes
	// and the kept answer in it, failed to commit and was not committed:
	// nothing happened. HTTP 503; Unavailable.
	RefusedCommitFailed
	// RefusedLeaseLost: the execution outlived its lease, another took the
	// key over, and its writes were rolled back with the store's
	// transaction. HTTP 503; Unavailable.
	RefusedLeaseLost
	// RefusedHandlerFailed: the handler gave no answer (Ran.Failure);
	// nothing was kept, and the key was released (Refusal.RolledBack: its
	// writes were rolled back too) or left to its lease (Ran.Crashed).
	// HTTP 500; on gRPC the handler's own error, or its panic raised again.
	RefusedHandlerFailed
	// RefusedUnfinished: the execution failed after a recovery point; its
	// key stays in flight with the point, for the client's retry or a
	// Completer to go on from. HTTP 503 (or what the handler answered);
	// the handler's own error on gRPC.
	RefusedUnfinished
	// RefusedTooLarge: the answer exceeded what is kept, inside the
	// store's transaction, which was rolled back. HTTP 500; Internal.
	RefusedTooLarge
	// RefusedUnkeepable: the answer could not be kept (Ran.Err), inside
	// the store's transaction, which was rolled back. HTTP 500; Internal.
	RefusedUnkeepable
	// RefusedUnreadable: the key's kept answer, or its recovery point,
	// cannot be read (sealed with a key no longer among Config.BodyKeys,
	// altered in the store); the request is not run again. HTTP 500;
	// Internal.
	RefusedUnreadable
)

var reasonNames = [...]string{"", "mismatch", "in_flight", "store_unavailable", "commit_failed", "lease_lost",
	"handler_failed", "unfinished", "too_large", "unkeepable", "unreadable"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) && r != 0 {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Refusal is what the engine tells a face to refuse a request with.
type Refusal struct {
	Reason Reason
	// RetryAfter, when positive, is how long the client should wait before
	// it retries with the same key (Retry-After; a RetryInfo).
	RetryAfter time.Duration
	// State is the key's state, for RefusedMismatch: in flight or
	// completed.
	State idem.State
	// RolledBack says, for RefusedHandlerFailed, that the handler ran
	// inside the store's transaction and its writes were rolled back.
	RolledBack bool
	// Err is what failed, for the face's log, never for its client: the
	// store's error, or why a kept answer cannot be read.
	Err error
}
