package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// TestKeyPatternAgreesWithParseKey: the syntax the document publishes is
// the one the middleware enforces.
func TestKeyPatternAgreesWithParseKey(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(idemhttp.KeyPattern)
	long := strings.Repeat("k", idem.MaxKeyLen)
	for _, v := range []string{
		"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", long, long + "k", "", " ", "a b", "a\tb", "é",
		`a"b`, `"a"`, `""`, `"`, `"a`, `"a b"`, `"a\"b"`, `"a\\b"`, `"a\b"`, `"a\"`, `"a"b`, `"a";p=1`,
		`"` + long + `"`, `"` + long + `k"`, `"` + strings.Repeat(`\"`, idem.MaxKeyLen) + `"`,
		`"` + strings.Repeat(`\\`, idem.MaxKeyLen+1) + `"`, "\x7f", "~!#$%&'()*+,-./:;<=>?@[]^_`{|}",
	} {
		_, err := idem.ParseKey(v)
		if got, want := re.MatchString(v), err == nil; got != want {
			t.Errorf("KeyPattern matches %q: %v; ParseKey accepts it: %v (%v)", v, got, want, err)
		}
	}
}

func TestPolicyDescribesTheMiddleware(t *testing.T) {
	t.Parallel()
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true,
		Store:         idemmem.NewStore(nil),
		TTL:           2 * time.Hour,
		Lease:         30 * time.Second,
		MaxBodyBytes:  64,
		ReplayHeaders: []string{"x-request-id"},
		Methods:       []string{"put", "POST"},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := m.Policy()
	if !p.KeyRequired || p.Expiry != 2*time.Hour || p.Lease != 30*time.Second || p.InflightWait != idemhttp.DefaultInflightWait || p.MaxBodyBytes != 64 {
		t.Errorf("Policy() = %+v", p)
	}
	if !slices.Equal(p.Methods, []string{"POST", "PUT"}) {
		t.Errorf("Methods = %v, want [POST PUT]", p.Methods)
	}
	if !slices.Contains(p.ReplayedHeaders, "X-Request-Id") || !slices.Contains(p.ReplayedHeaders, "Location") {
		t.Errorf("ReplayedHeaders = %v", p.ReplayedHeaders)
	}
	statuses := map[int]idemhttp.PolicyAnswer{}
	for _, a := range p.Answers {
		statuses[a.Status] = a
	}
	for _, s := range []int{400, 409, 413, 422, 503} {
		if _, ok := statuses[s]; !ok {
			t.Errorf("no %d answer in %+v", s, p.Answers)
		}
	}
	if !statuses[409].RetryAfter || !statuses[503].RetryAfter {
		t.Errorf("409 and 503 must say Retry-After: %+v", p.Answers)
	}

	opt, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Optional: true})
	if err != nil {
		t.Fatal(err)
	}
	op := opt.Policy()
	if op.KeyRequired {
		t.Error("an Optional middleware's policy requires the key")
	}
	for _, a := range op.Answers {
		for _, pr := range a.Problems {
			if pr.Type == idemhttp.ProblemKeyMissing {
				t.Errorf("an Optional middleware's policy says it answers %s", pr.Type)
			}
		}
	}
	frag := op.OpenAPI()
	if frag.Parameter["required"] != false || frag.Extension["expiry"] != idemhttp.DefaultTTL.Seconds() {
		t.Errorf("fragment of the optional policy: %v, %v", frag.Parameter, frag.Extension)
	}
}

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
