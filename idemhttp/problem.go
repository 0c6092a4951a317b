package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemContentType is the media type of RFC 9457 problem details.
const ProblemContentType = "application/problem+json"

// Problem types the middleware answers with. They are URNs, so they name
// the problem without pretending to be a page someone can open.
const (
	ProblemKeyMissing       = "urn:idem:problem:idempotency-key-missing"
	ProblemKeyInvalid       = "urn:idem:problem:idempotency-key-invalid"
	ProblemKeyMismatch      = "urn:idem:problem:idempotency-key-mismatch"
	ProblemInFlight         = "urn:idem:problem:request-in-flight"
	ProblemBodyTooLarge     = "urn:idem:problem:body-too-large"
	ProblemBodyUnreadable   = "urn:idem:problem:body-unreadable"
	ProblemScope            = "urn:idem:problem:scope-unavailable"
	ProblemStoreUnavailable = "urn:idem:problem:store-unavailable"
	ProblemLeaseLost        = "urn:idem:problem:lease-lost"
	ProblemHandlerFailed    = "urn:idem:problem:handler-failed"
	ProblemResponseTooLarge = "urn:idem:problem:response-too-large"
)

// Problem is an RFC 9457 problem details object.
type Problem struct {
	// Type is a URI naming the kind of problem; clients branch on it.
	Type string
	// Title is a short, fixed summary of the kind of problem.
	Title string
	// Status is the HTTP status code.
	Status int
	// Detail explains this occurrence, in words a developer can act on.
	Detail string
	// Instance optionally identifies this occurrence.
	Instance string
	// Extra holds extension members, serialised beside the standard ones.
	// Members named like a standard one are ignored.
	Extra map[string]any
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
}

// MarshalJSON writes the standard members and the extensions in one object.
func (p *Problem) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(p.Extra)+5)
	for k, v := range p.Extra {
		m[k] = v
	}
	if p.Type != "" {
		m["type"] = p.Type
	} else {
		m["type"] = "about:blank"
	}
	m["title"] = p.Title
	m["status"] = p.Status
	if p.Detail != "" {
		m["detail"] = p.Detail
	} else {
		delete(m, "detail")
	}
	if p.Instance != "" {
		m["instance"] = p.Instance
	} else {
		delete(m, "instance")
	}
	return json.Marshal(m)
}

// Error makes a Problem usable as an error.
func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Title + ": " + p.Detail
	}
	return p.Title
}

// Write sends the problem as the response: Content-Type
// application/problem+json, Retry-After when set, the status and the body.
func (p *Problem) Write(w http.ResponseWriter) {
	body, err := json.Marshal(p)
	if err != nil {
		// Only an Extra value that cannot be marshalled gets here; drop the
		// extensions rather than answer with nothing.
		q := *p
		q.Extra = nil
		body, _ = json.Marshal(&q)
	}
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}
