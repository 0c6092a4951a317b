package idemtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Face is a face of the engine (package keyed) as TestFace drives it: it
// serves a handler the suite writes, through its protocol, in front of a
// store, and sends that server requests as a client of its protocol would.
// idemtest.HTTP is idemhttp's; idemgrpc's tests have one for idemgrpc, and
// examples/jsonrpc's for its JSON-RPC face; a face written outside this
// repository writes its own, a page long.
type Face interface {
	// Name names the face in the subtests' names.
	Name() string
	// Serve starts a server of the face with cfg (its engine's settings,
	// and the application's handler) and returns it; it stops when t ends.
	Serve(t *testing.T, cfg FaceConfig) Server
}

// FaceConfig is what a Face's server runs with.
type FaceConfig struct {
	// Engine is the engine's configuration: the face passes each field it
	// sets to its own Config (its Store, Lease, InflightWait, SeparateTx,
	// Clock, Timers, Holder…).
	Engine keyed.Config
	// Handler is the application's handler.
	Handler FaceHandler
	// Arrived, when set, is called with each request's context as the
	// face's server received it (before the face reads the key): the suite
	// watches it end when the client leaves.
	Arrived func(ctx context.Context)
}

// FaceHandler is the application's handler, in the suite's words: it gets
// the handler's context and the request's body, and replies. It may panic.
type FaceHandler func(ctx context.Context, body string) Reply

// Reply is what a FaceHandler answers: a Kind and a body, which the face
// sends as its protocol says (idemtest.HTTP: 201, 402 and 503 with the body
// as text; idemgrpc: OK with the body in a message, FailedPrecondition and
// Unavailable with the body as the status's message).
type Reply struct {
	Kind Kind
	Body string
}

// Kind classifies an answer, the same on every face.
type Kind string

// Kinds of the handler's own answers (Reply.Kind), and of what a client
// sees (Answer.Kind).
const (
	Created   Kind = "created"   // the handler succeeded: a deterministic answer, kept
	Refused   Kind = "refused"   // the handler refused the request: a deterministic answer, kept
	Transient Kind = "transient" // the handler failed transiently: nothing kept, the key released

	// What the engine answers itself (keyed.Reason), as a client tells it.
	Mismatch    Kind = "mismatch"          // keyed.RefusedMismatch
	InFlight    Kind = "in_flight"         // keyed.RefusedInFlight
	Unavailable Kind = "store_unavailable" // keyed.RefusedStoreUnavailable or RefusedCommitFailed
	LeaseLost   Kind = "lease_lost"        // keyed.RefusedLeaseLost
	Failed      Kind = "failed"            // the handler gave no answer: it panicked (RefusedHandlerFailed; on gRPC a recoverer's Internal)
	Unfinished  Kind = "unfinished"        // keyed.RefusedUnfinished, where a face speaks it as itself
	Unreadable  Kind = "unreadable"        // keyed.RefusedUnreadable
	Gone        Kind = "gone"              // the client gave up (its context ended) before an answer
	Other       Kind = "other"             // anything else: a face's answer the suite does not know
)

// Answer is what a client of the face saw, in the suite's words.
type Answer struct {
	Kind Kind
	// Body is the handler's Reply.Body, when Kind is one of the handler's.
	Body string
	// Replayed says the answer was a replay of a kept one.
	Replayed bool
	// RetryAfter is the delay the answer asked the client to wait before
	// it retries (Retry-After, a RetryInfo), or 0.
	RetryAfter time.Duration
	// Raw describes the answer as the protocol gave it, for failure
	// messages.
	Raw string
}

func (a Answer) String() string {
	return fmt.Sprintf("%s %q (replayed %v, retry after %v; %s)", a.Kind, a.Body, a.Replayed, a.RetryAfter, a.Raw)
}

// Server is a face's server, as TestFace uses it.
type Server interface {
	// Do sends one request with key and body, and waits for its answer.
	Do(ctx context.Context, key, body string) Answer
	// Counts returns the face's counts of outcomes (its engine's).
	Counts() map[keyed.Outcome]uint64
	// Restart is the face's Restart (keyed.Engine.Restart).
	Restart(ctx context.Context) (int, error)
	// NewCompleter makes the face's Completer, whose resume answers as
	// resume does (a Reply of kind Created or Refused is kept; an error is
	// an unknown outcome, or keyed.ErrNothingDone).
	NewCompleter(cfg keyed.CompleterConfig, resume FaceResume) (*keyed.Completer, error)
}

// FaceResume is the application's Resume, in the suite's words.
type FaceResume func(ctx context.Context, ex keyed.Execution) (Reply, error)

// TestFace checks a face of the engine in front of the stores open makes:
// the behaviours of keyed's table, as a client of the face meets them
// (first run, replay, mismatch, duplicates that wait for the execution in
// flight within their caller's deadline, a caller that leaves while the
// handler runs, transient and deterministic answers, a panic, recovery
// points never released in any form, yielded leases, the Completer, a
// lease lost, an ambiguous commit, a handler that runs three times its
// lease while its lease is renewed, a renewal that fails, a replica's
// restart, a duplicate told to retry when the holder's lease ends, the
// Completer resuming Parallel keys at once, renewing what it resumes and
// counting an answer it could not keep as unknown), the same on every face. A store that is an idem.TxStore is
// checked in its same-transaction form, and in the separate form where a
// case needs it; a case that needs what the store lacks (recovery points,
// holders) is skipped with the reason.
//
// open must return a fresh, empty store that reads time from clock, as
// TestStore's constructor does. The cases run as parallel subtests.
func TestFace(t *testing.T, face Face, open func(t *testing.T, clock idem.Clock) idem.Store) {
	t.Helper()
	runFaceCases(t, face, open)
}
