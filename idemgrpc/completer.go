package idemgrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// ResumeFunc finishes an abandoned call from its recovery point
// (ex.Recovery), with nobody waiting for the answer: it does what the
// handler's remaining phases would, and answers as the handler would, a
// response message or a status error. ctx carries ex, so SaveRecovery and
// KeyFromContext work as in the handler, and ends at
// CompleterConfig.Timeout. ex.FullMethod is empty: a key's record does not
// say which method it was claimed by, so dispatch on ex.Recovery.Name.
//
// An answer the interceptor would keep (Config.Keep: OK, or a
// deterministic status such as FailedPrecondition) is kept, and the
// client's retry gets it replayed. Returning ErrNothingDone releases the
// key. Any other error (a transient status, or not a status at all) leaves
// the key in flight with its point: its outcome is unknown, and the
// Completer tries again once the lease it took ends.
type ResumeFunc func(ctx context.Context, ex Execution) (any, error)

// ErrNothingDone is what a Resume returns when it learned that nothing
// happened past the database's edge: the Completer then releases the key,
// and the client's retry runs the call anew. It is keyed.ErrNothingDone.
var ErrNothingDone = keyed.ErrNothingDone

// CompleterConfig configures a Completer.
type CompleterConfig struct {
	// Resume finishes one abandoned call. Required.
	Resume ResumeFunc
	// Every is how often the Completer looks for abandoned executions.
	// Defaults to 1s.
	Every time.Duration
	// Timeout bounds one round, from its start: its listing of the
	// abandoned keys, the claim that takes each over, each Resume (whose
	// lease is renewed while it runs) and the keeping of its answer. It is
	// part of the Completer's Bound. Defaults to nine tenths of the lease.
	Timeout time.Duration
	// Limit is how many abandoned keys one round takes on. Defaults to 100.
	Limit int
	// Parallel is how many of a round's keys are resumed at once. Defaults
	// to 16.
	Parallel int
	// Logger defaults to the Interceptor's.
	Logger *slog.Logger
	// Points names the recovery points this Completer resumes; a key
	// abandoned at another point is left to the Completer that names it
	// (keyed.CompleterConfig.Points): another face's on the same store,
	// say, which keeps its answers in its own form. Defaults to none:
	// every point.
	Points []string
	// Settle turns an operator's answer (Completer.Settle's, given as an
	// HTTP answer: a status, a Content-Type, a body; as the console's
	// "settle as failed" and "settle with an answer" and idem keys settle
	// make them) into the call's answer, as the handler would answer: a
	// response message (for a 2xx), or a status error. The answer is kept
	// as the interceptor keeps a handler's, so the client's retry gets it
	// replayed; its headers but Content-Type go with it as header
	// metadata, lowercased (Idem-Settled-By-Operator becomes
	// idem-settled-by-operator), whatever Config.ReplayMetadata says. An
	// error that is not a status refuses the settle, changing nothing, and
	// so does a status Config.Keep does not keep (as a Resume's: a code
	// that asks the client to retry, such as the Unavailable of a 503,
	// would be replayed to each retry for as long as the key lives).
	// Defaults to DefaultSettle, which refuses a 2xx.
	Settle func(answer idem.Response) (any, error)
}

// ErrSettleNeedsMessage is DefaultSettle's refusal of a 2xx answer: its
// response message is of the method's type, which only the application
// can make from the operator's body (CompleterConfig.Settle).
var ErrSettleNeedsMessage = errors.New("idemgrpc: a settled 2xx answer is a response message, which only the application can make from its body (idemgrpc.CompleterConfig.Settle); settle with a status (a 4xx or a 5xx)")

// errSettleNotKept refuses a settled answer whose code Config.Keep does
// not keep.
var errSettleNotKept = errors.New("idemgrpc: the settled answer is not one the interceptor keeps")

// DefaultSettle is CompleterConfig.Settle's default: a status whose code
// means what answer's HTTP status means to a gRPC client (SettleCode),
// whose message is the answer's problem document's title and detail
// (application/problem+json, RFC 9457) or its body as text. A 2xx is
// refused (ErrSettleNeedsMessage).
func DefaultSettle(answer idem.Response) (any, error) {
	if answer.Status >= 200 && answer.Status < 300 {
		return nil, ErrSettleNeedsMessage
	}
	return nil, status.Error(SettleCode(answer.Status), settleMessage(answer))
}

// SettleCode is the gRPC code a settled answer's HTTP status gives the
// client. A 409, an operator's "settled as failed", is FailedPrecondition:
// the call will not succeed under this key, and a retry of it must not be
// told to wait and try again (Aborted is what the interceptor answers a
// duplicate of a call in flight).
func SettleCode(httpStatus int) codes.Code {
	switch {
	case httpStatus >= 200 && httpStatus < 300:
		return codes.OK
	}
	switch httpStatus {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound, http.StatusGone:
		return codes.NotFound
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case 499:
		return codes.Canceled
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	if httpStatus >= 400 && httpStatus < 500 {
		return codes.FailedPrecondition
	}
	return codes.Internal
}

// maxSettleMessage bounds a settled status's message taken from a body
// that is not a problem document.
const maxSettleMessage = 1024

// settleMessage is the status message of a settled answer.
func settleMessage(answer idem.Response) string {
	ct := strings.ToLower(answer.Header.Get("Content-Type"))
	if strings.Contains(ct, "json") {
		var p struct {
			Title  string `json:"title"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(answer.Body, &p) == nil && (p.Title != "" || p.Detail != "") {
			switch {
			case p.Title == "":
				return p.Detail
			case p.Detail == "":
				return p.Title
			}
			return p.Title + ": " + p.Detail
		}
	}
	// A byte that is not UTF-8 reads as U+FFFD, as gRPC shows it to the
	// client, whether the text is cut or not.
	msg := strings.TrimSpace(strings.ToValidUTF8(string(answer.Body), "\uFFFD"))
	if len(msg) > maxSettleMessage {
		// Never inside a character: one the cut splits is left out.
		msg = strings.ToValidUTF8(msg[:maxSettleMessage], "")
	}
	if msg == "" {
		msg = http.StatusText(answer.Status)
	}
	return msg
}

// settledMetadata is the header metadata of a settled answer: its headers
// but Content-Type, named in lowercase; a name metadata cannot carry, or
// gRPC reserves (grpc-…), is left out.
func settledMetadata(h http.Header) metadata.MD {
	md := metadata.MD{}
	for name, vals := range h {
		lower := strings.ToLower(name)
		if lower == "content-type" || lower == "content-length" || strings.HasPrefix(lower, "grpc-") || !validMDName(lower) {
			continue
		}
		md[lower] = append([]string(nil), vals...)
	}
	return md
}

// validMDName reports whether name may name metadata: lowercase letters,
// digits, '-', '_' and '.'.
func validMDName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// Completer finishes, in the background, the calls whose holder died after
// saving a recovery point: the engine's (keyed.Completer), which says how
// and within what bound. Make one with Interceptor.NewCompleter, run it
// with Run.
type Completer = keyed.Completer

// NewCompleter returns a Completer for i's store, which must be an
// idem.Recoverer. It keeps answers as i keeps them: the metadata i
// replays is not there to keep (a Resume sets none), the message sealed
// with Config.BodyKeys.
func (i *Interceptor) NewCompleter(cfg *CompleterConfig) (*Completer, error) {
	var c CompleterConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Resume == nil {
		return nil, &idem.ArgumentError{Field: "idemgrpc.CompleterConfig.Resume", Reason: "is required"}
	}
	resume, settle := c.Resume, c.Settle
	if settle == nil {
		settle = DefaultSettle
	}
	comp, err := i.eng.NewCompleter(&keyed.CompleterConfig{Every: c.Every, Timeout: c.Timeout, Limit: c.Limit, Parallel: c.Parallel, Logger: c.Logger, Points: c.Points,
		SettleAnswer: func(answer idem.Response) (idem.Response, error) {
			resp, serr := settle(answer)
			if _, isStatus := status.FromError(serr); serr != nil && !isStatus {
				return idem.Response{}, serr
			}
			if code := status.Code(serr); !i.cfg.Keep("", code) {
				// As a Resume's: a code that tells the client to retry
				// (Unavailable, Internal, ResourceExhausted...) is not
				// kept, or every retry would get it replayed for as long as
				// the key lives.
				return idem.Response{}, fmt.Errorf("%w: %v is an answer this face does not keep (Config.Keep): it asks the client to retry, which would get it replayed for as long as the key lives", errSettleNotKept, code)
			}
			kept, overflow, err := i.keptAnswer(resp, serr, nil, settledMetadata(answer.Header))
			switch {
			case err != nil:
				return idem.Response{}, err
			case overflow:
				return idem.Response{}, fmt.Errorf("the answer exceeds %d bytes, the most that is kept", i.cfg.MaxResponseBytes)
			}
			return kept, nil
		},
		Resume: func(ctx context.Context, kex keyed.Execution) (idem.Response, error) {
			ex := Execution{Scope: kex.Scope, Key: kex.Key, Token: kex.Token, ClaimedAt: kex.ClaimedAt, TookOver: kex.TookOver, Recovery: kex.Recovery, engine: kex}
			ctx = context.WithValue(ctx, execKey{}, &execution{Execution: ex})
			resp, rerr := resume(ctx, ex)
			if errors.Is(rerr, keyed.ErrNothingDone) {
				return idem.Response{}, rerr
			}
			if _, isStatus := status.FromError(rerr); !isStatus || !i.cfg.Keep("", status.Code(rerr)) {
				return idem.Response{}, rerr
			}
			kept, overflow, err := i.keptAnswer(resp, rerr, nil, nil)
			switch {
			case err != nil:
				return idem.Response{}, err
			case overflow:
				return idem.Response{}, fmt.Errorf("the answer exceeds %d bytes, the most that is kept", i.cfg.MaxResponseBytes)
			}
			return kept, nil
		}})
	if err != nil {
		return nil, err
	}
	return comp, nil
}
