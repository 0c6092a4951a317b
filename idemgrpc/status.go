package idemgrpc

import (
	"net/http"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that every
// status the interceptor makes itself carries, beside one of the Reason…
// values: what a client branches on, where idemhttp's answers carry a
// problem type.
const ErrorDomain = "idem.idem-go.github.com"

// Reasons of the interceptor's own statuses (google.rpc.ErrorInfo.Reason),
// each with its code and idemhttp's counterpart.
const (
	ReasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"  // InvalidArgument; HTTP 400
	ReasonKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"  // InvalidArgument; HTTP 400
	ReasonKeyMismatch      = "IDEMPOTENCY_KEY_MISMATCH" // FailedPrecondition; HTTP 422
	ReasonInFlight         = "REQUEST_IN_FLIGHT"        // Aborted with RetryInfo; HTTP 409 with Retry-After
	ReasonScope            = "SCOPE_UNAVAILABLE"        // Unauthenticated; HTTP 400
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"        // Unavailable with RetryInfo; HTTP 503 with Retry-After
	ReasonLeaseLost        = "LEASE_LOST"               // Unavailable with RetryInfo; HTTP 503 with Retry-After
	ReasonRequestType      = "REQUEST_NOT_PROTOBUF"     // Internal: the request cannot be fingerprinted
	ReasonStreaming        = "STREAMING_NOT_PROTECTED"  // Unimplemented: a key sent on a streaming RPC
	ReasonResponseTooLarge = "RESPONSE_TOO_LARGE"       // Internal, rolled back: the answer exceeds MaxResponseBytes; HTTP 500
)

// refusal makes one of the interceptor's own statuses; retryAfter, when
// positive, adds a google.rpc.RetryInfo.
func refusal(code codes.Code, reason, msg string, retryAfter time.Duration) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		// Only a status OK refuses details, and no refusal is OK.
		return status.Error(code, msg)
	}
	return st.Err()
}

// Reason returns the google.rpc.ErrorInfo reason of err when the
// interceptor made it (its domain is ErrorDomain), and "" otherwise: a
// client tells a refused key reuse (ReasonKeyMismatch) from the handler's
// own FailedPrecondition by it.
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// retryDelay returns the delay of st's google.rpc.RetryInfo, if it has one.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// HTTPStatus is the HTTP status a gRPC code corresponds to, as
// google.rpc.Code documents the mapping (and grpc-gateway applies it). The
// kept answer's idem.Response.Status is this, so that what reads a store
// (idem keys show, an Observer's Event.Status) sees one scale for both
// halves; the code itself is kept beside it, and is what a replay returns.
func HTTPStatus(code codes.Code) int {
	switch code {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499 // Client Closed Request
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss
}
