package idemhttp

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// KeyPattern is the syntax of the Idempotency-Key header value that
// idem.ParseKey accepts, as a regular expression valid both in Go and in
// ECMA-262 (JSON Schema's dialect): 1 to 255 visible ASCII characters,
// either bare (not starting with a quote) or as an RFC 9651 sf-string,
// whose escapes \" and \\ count as one character each.
const KeyPattern = `^(?:[\x21\x23-\x7E][\x21-\x7E]{0,254}|"(?:[\x21\x23-\x5B\x5D-\x7E]|\\[\x22\x5C]){1,255}")$`

// Policy is a route's idempotency policy, as the IETF draft asks a
// resource to publish it: whether the key is required, for which methods,
// how long it is remembered, and every answer the middleware itself can
// give. Middleware.Policy describes one; Policy.OpenAPI renders it.
type Policy struct {
	// Methods are the protected methods, upper case, sorted.
	Methods []string
	// KeyRequired is false when requests without a key pass unprotected
	// (Config.Optional).
	KeyRequired bool
	// Expiry is how long a key is remembered from its claim (Config.TTL).
	Expiry time.Duration
	// Lease is how long one execution holds its key before a retry may
	// take it over (Config.Lease).
	Lease time.Duration
	// InflightWait is how long a duplicate waits for the first execution
	// before it gets 409; zero or negative means not at all.
	InflightWait time.Duration
	// MaxBodyBytes is the largest request body; larger ones get 413.
	MaxBodyBytes int64
	// ReplayedHeaders are the response headers kept and replayed, besides
	// Idempotent-Replayed, which every replay carries.
	ReplayedHeaders []string
	// Answers are the answers the middleware gives itself, never the
	// handler, by status, ascending. Each is an RFC 9457 problem+json.
	Answers []PolicyAnswer
}

// PolicyAnswer is one status the middleware answers with.
type PolicyAnswer struct {
	Status int
	// Problems are the problem types this status is sent with (the
	// Problem… constants), each with its title.
	Problems []PolicyProblem
	// RetryAfter says that every answer of this status carries a
	// Retry-After header (seconds).
	RetryAfter bool
	// Description says when the answer is given.
	Description string
}

// PolicyProblem is a problem type and the title it is sent with.
type PolicyProblem struct {
	Type  string
	Title string
}

// Policy describes m's idempotency policy. It is read from m's
// configuration, so what it says is what m does.
func (m *Middleware) Policy() Policy {
	p := Policy{
		KeyRequired:     !m.cfg.Optional,
		Expiry:          m.cfg.TTL,
		Lease:           m.cfg.Lease,
		InflightWait:    max(m.cfg.InflightWait, 0),
		MaxBodyBytes:    m.cfg.MaxBodyBytes,
		ReplayedHeaders: slices.Clone(m.replay),
	}
	for meth := range m.methods {
		p.Methods = append(p.Methods, meth)
	}
	slices.Sort(p.Methods)

	bad := []PolicyProblem{}
	if p.KeyRequired {
		bad = append(bad, PolicyProblem{ProblemKeyMissing, "Idempotency key missing"})
	}
	bad = append(bad, PolicyProblem{ProblemKeyInvalid, "Invalid idempotency key"})
	if m.cfg.Scope != nil {
		bad = append(bad, PolicyProblem{ProblemScope, scopeTitle})
	}
	bad = append(bad, PolicyProblem{ProblemBodyUnreadable, "Request body unreadable"})
	badWhen := "The Idempotency-Key header is malformed or sent more than once"
	if p.KeyRequired {
		badWhen = "The Idempotency-Key header is missing, malformed or sent more than once"
	}
	failed := []PolicyProblem{{ProblemHandlerFailed, "Request failed"}}
	unavailable := []PolicyProblem{{ProblemStoreUnavailable, "Idempotency store unavailable"}}
	if m.eng.InTx() {
		// Only the same-transaction form rolls back an answer too large
		// to keep, and refuses a superseded execution's commit.
		failed = append(failed, PolicyProblem{ProblemResponseTooLarge, "Response too large to keep"})
		unavailable = append(unavailable, PolicyProblem{ProblemLeaseLost, "Request superseded"})
	}
	// Any store may hold bodies sealed by BodyKeys, even with none set now
	// (they were removed), so a replay can always find one it cannot open.
	failed = append(failed, PolicyProblem{ProblemAnswerUnreadable, "Kept answer unreadable"})
	p.Answers = []PolicyAnswer{
		{Status: http.StatusBadRequest, Problems: bad,
			Description: badWhen + ", or the body could not be read. Nothing ran; nothing was kept."},
		{Status: http.StatusConflict, Problems: []PolicyProblem{{ProblemInFlight, "Request in flight"}}, RetryAfter: true,
			Description: "A request with this key is still running after the duplicate waited for it. Retry later with the same key."},
		{Status: http.StatusRequestEntityTooLarge, Problems: []PolicyProblem{{ProblemBodyTooLarge, "Request body too large"}},
			Description: "The body exceeds " + strconv.FormatInt(p.MaxBodyBytes, 10) + " bytes. Nothing ran."},
		{Status: http.StatusUnprocessableEntity, Problems: []PolicyProblem{{ProblemKeyMismatch, "Idempotency key reused"}},
			Description: "The key was already used with a different request (method, path, query or body). Use a new key for a new operation."},
		{Status: http.StatusInternalServerError, Problems: failed,
			Description: "The request panicked, timed out or answered more than can be kept; nothing was kept. Retry with the same key."},
		{Status: http.StatusServiceUnavailable, Problems: unavailable, RetryAfter: true,
			Description: "The idempotency store could not claim or complete the key, so nothing ran or it was rolled back. Retry with the same key."},
	}
	if m.cfg.Scope != nil && !m.cfg.SharedScope {
		p.Answers = append(p.Answers[:1:1], append([]PolicyAnswer{{Status: http.StatusUnauthorized,
			Problems:    []PolicyProblem{{ProblemScope, scopeTitle}},
			Description: "The server could not tell whom the key belongs to (no tenant or credentials). Nothing ran; nothing was kept."}},
			p.Answers[1:]...)...)
	}
	return p
}

// OpenAPIFragment is a Policy rendered as the parts of an OpenAPI 3.1
// Operation Object it contributes, as plain JSON values: marshalled with
// encoding/json they are the OpenAPI text, and a document built with any
// library (or none) can take them in. ApplyTo merges them into one.
type OpenAPIFragment struct {
	// Parameter is the Idempotency-Key header's Parameter Object.
	Parameter map[string]any
	// Responses are the middleware's own answers, by status code, each a
	// Response Object with its application/problem+json schema.
	Responses map[string]any
	// ReplayHeaders are the Header Objects a kept answer carries when it is
	// replayed: Idempotent-Replayed and Idempotent-Body-Omitted.
	ReplayHeaders map[string]any
	// Extension is the value of the operation's x-idempotency member:
	// the key's header, whether it is required, the methods, the expiry and
	// lease (seconds), how long a duplicate waits, the replayed headers.
	Extension map[string]any
}

// ProblemSchema returns a JSON Schema (2020-12, OpenAPI 3.1's dialect) of
// an RFC 9457 problem details object as Problem writes it: type, title and
// status always, detail and instance when set, extension members besides.
func ProblemSchema() map[string]any {
	return map[string]any{
		"type":     "object",
		"required": []any{"type", "title", "status"},
		"properties": map[string]any{
			"type":     map[string]any{"type": "string", "format": "uri-reference", "description": "A URI naming the kind of problem; clients branch on it."},
			"title":    map[string]any{"type": "string", "description": "A short, fixed summary of the kind of problem."},
			"status":   map[string]any{"type": "integer", "minimum": 100, "maximum": 599, "description": "The HTTP status code."},
			"detail":   map[string]any{"type": "string", "description": "What went wrong this time, in words a developer can act on."},
			"instance": map[string]any{"type": "string", "format": "uri-reference"},
		},
		"additionalProperties": true,
	}
}

// OpenAPI renders p as an OpenAPI 3.1 fragment. Each answer's schema is
// ProblemSchema narrowed to its status and its problem types, so a
// document that takes it in says exactly what the middleware sends.
func (p Policy) OpenAPI() OpenAPIFragment {
	keyDesc := "A unique key per intended operation (a UUID, say), sent with every attempt of it: " +
		"the first request with it runs, every duplicate gets its answer replayed. " +
		"1 to 255 visible ASCII characters, bare or as an RFC 9651 sf-string (\"quoted\"). " +
		"Remembered for " + seconds(p.Expiry) + " seconds from its first use."
	if !p.KeyRequired {
		keyDesc += " Optional: a request without it runs unprotected."
	}
	f := OpenAPIFragment{
		Parameter: map[string]any{
			"name":        HeaderKey,
			"in":          "header",
			"required":    p.KeyRequired,
			"description": keyDesc,
			"schema":      map[string]any{"type": "string", "minLength": 1, "pattern": KeyPattern},
		},
		Responses: map[string]any{},
		ReplayHeaders: map[string]any{
			HeaderReplayed: map[string]any{
				"description": "\"true\" on an answer replayed from an earlier request with the same Idempotency-Key.",
				"schema":      map[string]any{"type": "string", "enum": []any{"true"}},
			},
			HeaderBodyOmitted: map[string]any{
				"description": "\"true\" on a replay whose original body was too large to keep.",
				"schema":      map[string]any{"type": "string", "enum": []any{"true"}},
			},
		},
		Extension: map[string]any{
			"header":          HeaderKey,
			"required":        p.KeyRequired,
			"methods":         anySlice(p.Methods),
			"expiry":          p.Expiry.Seconds(),
			"lease":           p.Lease.Seconds(),
			"inflightWait":    p.InflightWait.Seconds(),
			"replayedHeaders": anySlice(p.ReplayedHeaders),
			"fingerprint":     "method, path, query, Content-Type and body (JSON compared canonically)",
			"specification":   "https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/",
		},
	}
	for _, a := range p.Answers {
		types := make([]any, 0, len(a.Problems))
		titles := make([]string, 0, len(a.Problems))
		for _, pr := range a.Problems {
			types = append(types, pr.Type)
			titles = append(titles, pr.Type+" ("+pr.Title+")")
		}
		schema := ProblemSchema()
		props := schema["properties"].(map[string]any)
		props["type"] = map[string]any{"type": "string", "enum": types}
		props["status"] = map[string]any{"type": "integer", "const": a.Status}
		resp := map[string]any{
			"description": a.Description + " Problem types: " + strings.Join(titles, ", ") + ".",
			"content": map[string]any{
				ProblemContentType: map[string]any{"schema": schema},
			},
		}
		if a.RetryAfter {
			resp["headers"] = map[string]any{"Retry-After": retryAfterHeader(true)}
		}
		f.Responses[strconv.Itoa(a.Status)] = resp
	}
	return f
}

// retryAfterHeader is the Header Object of Retry-After in seconds.
func retryAfterHeader(required bool) map[string]any {
	return map[string]any{
		"description": "Seconds to wait before retrying with the same key.",
		"required":    required,
		"schema":      map[string]any{"type": "integer", "minimum": 0},
	}
}

// ApplyTo merges f into op, an OpenAPI Operation Object as a map: it adds
// the Idempotency-Key parameter, the replay headers to each response op
// already has (the handler's answers, which the middleware replays), the
// middleware's answers, and x-idempotency. Where op already has a response
// of the same status, the two are merged: descriptions joined, headers
// united (a header required by only one becomes optional), and schemas of
// the same media type combined with anyOf when they differ.
func (f OpenAPIFragment) ApplyTo(op map[string]any) {
	params, _ := op["parameters"].([]any)
	op["parameters"] = append(params, f.Parameter)
	resps, _ := op["responses"].(map[string]any)
	if resps == nil {
		resps = map[string]any{}
		op["responses"] = resps
	}
	for _, r := range resps {
		resp, ok := r.(map[string]any)
		if !ok {
			continue
		}
		headers, _ := resp["headers"].(map[string]any)
		if headers == nil {
			headers = map[string]any{}
			resp["headers"] = headers
		}
		for name, h := range f.ReplayHeaders {
			if _, ok := headers[name]; !ok {
				headers[name] = h
			}
		}
	}
	for status, r := range f.Responses {
		ours := r.(map[string]any)
		theirs, ok := resps[status].(map[string]any)
		if !ok {
			resps[status] = ours
			continue
		}
		resps[status] = mergeResponses(theirs, ours)
	}
	op["x-idempotency"] = f.Extension
}

// mergeResponses is one Response Object saying both a and b.
func mergeResponses(a, b map[string]any) map[string]any {
	out := map[string]any{"description": joinText(a["description"], b["description"])}
	ah, _ := a["headers"].(map[string]any)
	bh, _ := b["headers"].(map[string]any)
	if len(ah)+len(bh) > 0 {
		headers := map[string]any{}
		for name, h := range ah {
			headers[name] = h
		}
		for name, h := range bh {
			if _, ok := headers[name]; !ok {
				headers[name] = h
			}
		}
		// A header is required of the merged answer only if both say so.
		for name, h := range headers {
			_, inA := ah[name]
			_, inB := bh[name]
			if hm, ok := h.(map[string]any); ok && (!inA || !inB) && hm["required"] == true {
				c := map[string]any{}
				for k, v := range hm {
					c[k] = v
				}
				c["required"] = false
				headers[name] = c
			}
		}
		out["headers"] = headers
	}
	ac, _ := a["content"].(map[string]any)
	bc, _ := b["content"].(map[string]any)
	if len(ac)+len(bc) > 0 {
		content := map[string]any{}
		for mt, m := range ac {
			content[mt] = m
		}
		for mt, m := range bc {
			existing, ok := content[mt].(map[string]any)
			if !ok {
				content[mt] = m
				continue
			}
			mm, _ := m.(map[string]any)
			if reflect.DeepEqual(jsonValue(existing["schema"]), jsonValue(mm["schema"])) {
				continue
			}
			content[mt] = map[string]any{"schema": map[string]any{"anyOf": []any{existing["schema"], mm["schema"]}}}
		}
		out["content"] = content
	}
	return out
}

func joinText(a, b any) string {
	as, _ := a.(string)
	bs, _ := b.(string)
	switch {
	case as == "":
		return bs
	case bs == "":
		return as
	}
	return as + " Or: " + bs
}

// jsonValue is v as encoding/json reads it back, so that values built
// differently (an int, a float64) compare as the JSON they become.
func jsonValue(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if json.Unmarshal(b, &out) != nil {
		return v
	}
	return out
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// seconds renders d in whole seconds, rounded down: a policy must never
// promise to remember a key longer than it does.
func seconds(d time.Duration) string {
	return strconv.FormatInt(int64(d/time.Second), 10)
}
