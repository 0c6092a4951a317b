package idemhttp_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// asJSON is v as encoding/json reads it back, for comparing documents.
func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// ApplyTo merges the middleware's answers into an operation that already
// has answers of the same statuses: descriptions joined (or the one that
// is there), headers united with a header required by only one side made
// optional, schemas of one media type kept when they are the same JSON
// and combined with anyOf when they differ; the handler's own answers get
// the replay headers. An operation with no responses gets the
// middleware's.
func TestOpenAPIApplyToMergesAnswers(t *testing.T) {
	t.Parallel()
	f := idemhttp.OpenAPIFragment{
		Parameter: map[string]any{"name": "Idempotency-Key", "in": "header"},
		Responses: map[string]any{
			"409": map[string]any{"description": "In flight.",
				"headers": map[string]any{"Retry-After": map[string]any{"required": true}},
				// An int here, a float64 in the operation read from JSON: the
				// same JSON, so the same schema.
				"content": map[string]any{"application/problem+json": map[string]any{"schema": map[string]any{"type": "object", "minimum": 0}}}},
			"422": map[string]any{"description": "Mismatch.",
				"content": map[string]any{"application/problem+json": map[string]any{"schema": map[string]any{"type": "object"}}}},
			"500": map[string]any{},
		},
		ReplayHeaders: map[string]any{"Idempotent-Replayed": map[string]any{"required": false}},
		Extension:     map[string]any{"header": "Idempotency-Key"},
	}
	op := mustJSON(t, `{"responses": {
		"201": {"description": "Created."},
		"409": {"description": "Name taken.",
			"headers": {"X-Trace": {"required": true}, "Retry-After": {"required": true}},
			"content": {"application/problem+json": {"schema": {"type": "object", "minimum": 0}},
				"application/json": {"schema": {"type": "string"}}}},
		"422": {"content": {"application/problem+json": {"schema": {"type": "string"}}}},
		"500": {"description": "Boom."}}}`)
	f.ApplyTo(op)
	want := mustJSON(t, `{
		"parameters": [{"name": "Idempotency-Key", "in": "header"}],
		"x-idempotency": {"header": "Idempotency-Key"},
		"responses": {
		"201": {"description": "Created.", "headers": {"Idempotent-Replayed": {"required": false}}},
		"409": {"description": "Name taken. Or: In flight.",
			"headers": {"X-Trace": {"required": false}, "Retry-After": {"required": true}, "Idempotent-Replayed": {"required": false}},
			"content": {"application/problem+json": {"schema": {"type": "object", "minimum": 0}},
				"application/json": {"schema": {"type": "string"}}}},
		"422": {"description": "Mismatch.",
			"headers": {"Idempotent-Replayed": {"required": false}},
			"content": {"application/problem+json": {"schema": {"anyOf": [{"type": "string"}, {"type": "object"}]}}}},
		"500": {"description": "Boom.", "headers": {"Idempotent-Replayed": {"required": false}}}}}`)
	if got := asJSON(t, op); !reflect.DeepEqual(got, asJSON(t, want)) {
		g, _ := json.MarshalIndent(got, "", " ")
		t.Fatalf("ApplyTo made\n%s", g)
	}

	// No replay headers and no headers on either side: the merged answer
	// has none. No responses at all: the middleware's.
	bare := idemhttp.OpenAPIFragment{Responses: map[string]any{"500": map[string]any{"description": "Failed."}}}
	op = mustJSON(t, `{"responses": {"500": {"description": "Boom."}}}`)
	bare.ApplyTo(op)
	if got := asJSON(t, op["responses"]); !reflect.DeepEqual(got, asJSON(t, mustJSON(t, `{"500": {"description": "Boom. Or: Failed."}}`))) {
		t.Fatalf("merged with no headers anywhere: %v", got)
	}
	// Headers on the middleware's side alone: they are the merged
	// answer's, made optional (the operation's own 409 does not send them).
	ours := idemhttp.OpenAPIFragment{Responses: map[string]any{"409": map[string]any{"description": "In flight.",
		"headers": map[string]any{"Retry-After": map[string]any{"required": true}}}}}
	op = mustJSON(t, `{"responses": {"409": {"description": "Name taken."}}}`)
	ours.ApplyTo(op)
	if got := asJSON(t, op["responses"]); !reflect.DeepEqual(got, asJSON(t, mustJSON(t, `{"409": {"description": "Name taken. Or: In flight.", "headers": {"Retry-After": {"required": false}}}}`))) {
		t.Fatalf("merged with headers on the middleware's side alone: %v", got)
	}
	op = map[string]any{}
	bare.ApplyTo(op)
	if got := asJSON(t, op["responses"]); !reflect.DeepEqual(got, asJSON(t, mustJSON(t, `{"500": {"description": "Failed."}}`))) {
		t.Fatalf("an operation with no responses: %v", got)
	}
}
