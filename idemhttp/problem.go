package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
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
	ProblemAnswerUnreadable = "urn:idem:problem:kept-answer-unreadable"
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

// MarshalJSON writes the standard members first, in the order RFC 9457
// lists them, then the extensions sorted by name.
func (p *Problem) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	member := func(name string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		enc, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("problem member %q: %w", name, err)
		}
		k, _ := json.Marshal(name)
		b.Write(k)
		b.WriteByte(':')
		b.Write(enc)
		return nil
	}
	typ := p.Type
	if typ == "" {
		typ = "about:blank"
	}
	member("type", typ)
	member("title", p.Title)
	member("status", p.Status)
	if p.Detail != "" {
		member("detail", p.Detail)
	}
	if p.Instance != "" {
		member("instance", p.Instance)
	}
	names := make([]string, 0, len(p.Extra))
	for k := range p.Extra {
		switch k {
		case "type", "title", "status", "detail", "instance":
		default:
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		if err := member(k, p.Extra[k]); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
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
