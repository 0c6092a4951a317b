package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// This test is idemhttp's, kept in the application's module with the
// service's own OpenAPI tests: the library's module requires nothing, and
// kin-openapi is what checks the documents.

// TestOpenAPIFragmentDescribesTheAnswers puts a middleware's fragment in an
// OpenAPI 3.1 document, has kin-openapi validate it, and checks the
// middleware's real answers against it.
func TestOpenAPIFragmentDescribesTheAnswers(t *testing.T) {
	t.Parallel()
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), MaxBodyBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	op := map[string]any{
		"operationId": "create",
		"requestBody": map[string]any{"content": map[string]any{"application/json": map[string]any{
			"schema": map[string]any{"type": "object"}}}},
		"responses": map[string]any{"201": map[string]any{"description": "Made.", "content": map[string]any{
			"application/json": map[string]any{"schema": map[string]any{
				"type": "object", "required": []any{"n"}, "properties": map[string]any{"n": map[string]any{"type": "integer"}}}}}}},
	}
	m.Policy().OpenAPI().ApplyTo(op)
	raw, err := json.Marshal(map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "t", "version": "1"},
		"paths":   map[string]any{"/things": map[string]any{"post": op}},
	})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the fragment makes an invalid document: %v\n%s", err, raw)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]int{"n": n})
	})))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name, key, body string
		status          int
		validRequest    bool
		problem         string
	}{
		{"first", "k1", `{"a":1}`, 201, true, ""},
		{"replay", "k1", `{"a":1}`, 201, true, ""},
		{"reused", "k1", `{"a":2}`, 422, true, idemhttp.ProblemKeyMismatch},
		{"missing", "", `{"a":1}`, 400, false, idemhttp.ProblemKeyMissing},
		{"malformed", "a b", `{"a":1}`, 400, false, idemhttp.ProblemKeyInvalid},
		{"too large", "k2", `{"a":"` + strings.Repeat("x", 64) + `"}`, 413, true, idemhttp.ProblemBodyTooLarge},
	} {
		hr, _ := http.NewRequest(http.MethodPost, srv.URL+"/things", strings.NewReader(tc.body))
		hr.Header.Set("Content-Type", "application/json")
		if tc.key != "" {
			hr.Header.Set(idemhttp.HeaderKey, tc.key)
		}
		route, params, err := router.FindRoute(hr)
		if err != nil {
			t.Fatal(err)
		}
		opts := &openapi3filter.Options{IncludeResponseStatus: true}
		in := &openapi3filter.RequestValidationInput{Request: hr, PathParams: params, Route: route, Options: opts}
		reqErr := openapi3filter.ValidateRequest(context.Background(), in)
		if (reqErr == nil) != tc.validRequest {
			t.Errorf("%s: request validation = %v, want valid %v", tc.name, reqErr, tc.validRequest)
		}
		hr.Body = io.NopCloser(strings.NewReader(tc.body))
		res, err := srv.Client().Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.name, res.StatusCode, body, tc.status)
		}
		if tc.problem != "" && !bytes.Contains(body, []byte(tc.problem)) {
			t.Errorf("%s: %s, want problem %s", tc.name, body, tc.problem)
		}
		if err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: res.StatusCode, Header: res.Header,
			Body: io.NopCloser(bytes.NewReader(body)), Options: opts,
		}); err != nil {
			t.Errorf("%s: the fragment does not describe %d %s: %v", tc.name, res.StatusCode, body, err)
		}
	}
	// A problem type the fragment does not list for the status is refused:
	// the schemas are narrow enough to catch drift.
	wrong := []byte(`{"type":"` + idemhttp.ProblemInFlight + `","title":"x","status":422}`)
	hr, _ := http.NewRequest(http.MethodPost, srv.URL+"/things", nil)
	route, params, _ := router.FindRoute(hr)
	opts := &openapi3filter.Options{IncludeResponseStatus: true, ExcludeRequestBody: true}
	if err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: hr, PathParams: params, Route: route, Options: opts},
		Status:                 422, Header: http.Header{"Content-Type": {idemhttp.ProblemContentType}},
		Body: io.NopCloser(bytes.NewReader(wrong)), Options: opts,
	}); err == nil {
		t.Error("a 422 of type request-in-flight passed validation")
	}
}
