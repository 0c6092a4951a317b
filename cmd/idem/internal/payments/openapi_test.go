package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

// contract checks every exchange with the service against its own
// OpenAPI document.
type contract struct {
	t      *testing.T
	e      *env
	doc    *openapi3.T
	router routers.Router
	// seen are the operations exercised, "METHOD /path template status".
	mu   sync.Mutex
	seen map[string]bool
}

// loadContract fetches GET /openapi.json from e without an API key, loads
// it with kin-openapi and validates it.
func loadContract(t *testing.T, e *env) *contract {
	t.Helper()
	res, err := e.srv.Client().Get(e.srv.URL + "/openapi.json")
	if err != nil {
		t.Fatalf("GET /openapi.json: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /openapi.json = %d, %v: %s", res.StatusCode, err, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("GET /openapi.json Content-Type = %q", ct)
	}
	doc, err := openapi3.NewLoader().LoadFromData(body)
	if err != nil {
		t.Fatalf("load the document: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("document is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the document is not valid OpenAPI: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	c := &contract{t: t, e: e, doc: doc, router: router, seen: map[string]bool{}}
	// The document itself is an exchange like any other.
	c.check(req{method: http.MethodGet, path: "/openapi.json", apiKey: "-"}, http.StatusOK, true)
	return c
}

// check sends q, which the document must find valid (validRequest) or
// refuse, expects status, and validates the response against the
// document: a status, header or body the document does not describe
// fails the test.
func (c *contract) check(q req, status int, validRequest bool) resp {
	t := c.t
	t.Helper()
	hr := c.e.newRequest(q)
	// The router matches on the path alone; the test server's host is not
	// the document's.
	route, params, err := c.router.FindRoute(hr)
	if err != nil {
		t.Fatalf("%s %s: the document has no such operation: %v", q.method, q.path, err)
	}
	opts := &openapi3filter.Options{
		AuthenticationFunc:    bearerPresent,
		IncludeResponseStatus: true,
		MultiError:            true,
	}
	in := &openapi3filter.RequestValidationInput{Request: hr, PathParams: params, Route: route, Options: opts}
	var body []byte
	if hr.Body != nil {
		body, _ = io.ReadAll(hr.Body)
		hr.Body = io.NopCloser(bytes.NewReader(body))
	}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	switch {
	case validRequest && reqErr != nil:
		t.Errorf("%s %s: the document refuses a request the service takes: %v", q.method, q.path, reqErr)
	case !validRequest && reqErr == nil:
		t.Errorf("%s %s: the document accepts a request the service refuses", q.method, q.path)
	}
	hr.Body = io.NopCloser(bytes.NewReader(body))
	hr.ContentLength = int64(len(body))
	res, err := c.e.srv.Client().Do(hr)
	if err != nil {
		t.Fatalf("%s %s: %v", q.method, q.path, err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: read: %v", q.method, q.path, err)
	}
	r := resp{status: res.StatusCode, header: res.Header, body: b}
	if r.status != status {
		t.Fatalf("%s %s = %s, want status %d", q.method, q.path, r, status)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 r.status,
		Header:                 r.header,
		Body:                   io.NopCloser(bytes.NewReader(b)),
		Options:                opts,
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s %s: the document does not describe the answer %s: %v", q.method, q.path, r, err)
	}
	c.mu.Lock()
	c.seen[fmt.Sprintf("%s %s %d", q.method, route.Path, r.status)] = true
	c.mu.Unlock()
	return r
}

// bearerPresent is the document's security scheme as a client can check
// it: an Authorization header of the Bearer scheme. Whether the key is
// valid is the service's to say.
func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	scheme, token, _ := strings.Cut(in.RequestValidationInput.Request.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return fmt.Errorf("security scheme %s: no bearer token", in.SecuritySchemeName)
	}
	return nil
}

func TestOpenAPIDocumentMatchesTheService(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *payments.Config) { c.KeyTTL = 2 * time.Hour })
	c := loadContract(t, e)

	// Every request body below sends each member its schema has: the
	// service's strict decoder refuses one it does not know, so a schema
	// that drifts from the handler's request fails here.
	account := c.check(req{method: "POST", path: "/v1/accounts", body: `{"balance":1000,"currency":"KRW"}`}, http.StatusCreated, true)
	acct := decode[struct{ ID string }](t, account).ID
	poor := decode[struct{ ID string }](t, c.check(req{method: "POST", path: "/v1/accounts", idemKey: `"acct-poor"`,
		body: `{"currency":"KRW"}`}, http.StatusCreated, true)).ID
	c.check(req{method: "GET", path: "/v1/accounts/" + acct}, http.StatusOK, true)
	c.check(req{method: "POST", path: "/v1/accounts/" + acct + "/deposits", idemKey: "dep-1", body: `{"amount":500}`}, http.StatusCreated, true)
	pay := payBody(acct, 300, "KRW")
	first := c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-1", body: pay}, http.StatusCreated, true)
	replay := c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-1", body: pay}, http.StatusCreated, true)
	if replay.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, replay.body) {
		t.Fatalf("the duplicate was not a replay: %s then %s", first, replay)
	}
	id := decode[struct{ ID string }](t, first).ID
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-1", body: payBody(acct, 301, "KRW")}, http.StatusUnprocessableEntity, true)
	c.check(req{method: "POST", path: "/v1/payments", body: pay}, http.StatusBadRequest, false)
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "bad key", body: pay}, http.StatusBadRequest, false)
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-0", body: payBody(acct, 0, "KRW")}, http.StatusBadRequest, false)
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-poor", body: payBody(poor, 5, "KRW")}, http.StatusPaymentRequired, true)
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-nowhere", body: payBody("acct_nope", 5, "KRW")}, http.StatusNotFound, true)
	huge := fmt.Sprintf(`{"account_id":%q,"amount":1,"currency":"KRW","description":%q}`, acct, strings.Repeat("x", payments.MaxBodyBytes))
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "pay-huge", body: huge}, http.StatusRequestEntityTooLarge, true)
	c.check(req{method: "POST", path: "/v1/payments", apiKey: "-", idemKey: "pay-anon", body: pay}, http.StatusUnauthorized, false)
	c.check(req{method: "GET", path: "/v1/payments/" + id}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/v1/payments/pay_nope"}, http.StatusNotFound, true)
	c.check(req{method: "GET", path: "/v1/accounts/acct_nope"}, http.StatusNotFound, true)
	list := c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/payments?limit=10"}, http.StatusOK, true)
	if got := decode[struct{ Data []json.RawMessage }](t, list).Data; len(got) != 1 {
		t.Fatalf("listed %d payments, want 1: %s", len(got), list)
	}
	c.check(req{method: "GET", path: "/v1/accounts/" + poor + "/payments"}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/payments?limit=0"}, http.StatusBadRequest, false)
	c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/payments?limit=1&starting_after=" + id}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/payments?ending_before=" + id}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/payments?starting_after=pay_nope"}, http.StatusBadRequest, true)
	c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/payments?starting_after=nope"}, http.StatusBadRequest, false)
	deps := c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/deposits?limit=10"}, http.StatusOK, true)
	if got := decode[struct{ Data []json.RawMessage }](t, deps).Data; len(got) != 1 {
		t.Fatalf("listed %d deposits, want 1: %s", len(got), deps)
	}
	c.check(req{method: "GET", path: "/v1/accounts/acct_nope/deposits"}, http.StatusNotFound, true)
	c.check(req{method: "GET", path: "/v1/accounts/" + acct + "/deposits?ending_before=dep_nope"}, http.StatusBadRequest, true)
	rf := c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-1",
		body: fmt.Sprintf(`{"payment_id":%q,"amount":100,"reason":"requested_by_customer"}`, id)}, http.StatusCreated, true)
	c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-1",
		body: fmt.Sprintf(`{"payment_id":%q,"amount":100,"reason":"requested_by_customer"}`, id)}, http.StatusCreated, true)
	c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-over", body: fmt.Sprintf(`{"payment_id":%q,"amount":201}`, id)}, http.StatusConflict, true)
	c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-nowhere", body: `{"payment_id":"pay_nope"}`}, http.StatusNotFound, true)
	c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-1", body: fmt.Sprintf(`{"payment_id":%q,"amount":99}`, id)}, http.StatusUnprocessableEntity, true)
	c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-0", body: fmt.Sprintf(`{"payment_id":%q,"amount":0}`, id)}, http.StatusBadRequest, false)
	c.check(req{method: "POST", path: "/v1/refunds", idemKey: "rf-rest", body: fmt.Sprintf(`{"payment_id":%q}`, id)}, http.StatusCreated, true)
	c.check(req{method: "GET", path: "/v1/refunds/" + decode[struct{ ID string }](t, rf).ID}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/v1/refunds/re_nope"}, http.StatusNotFound, true)
	c.check(req{method: "GET", path: "/v1/settlement"}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/healthz", apiKey: "-"}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/readyz", apiKey: "-"}, http.StatusOK, true)
	c.check(req{method: "GET", path: "/metrics", apiKey: "-"}, http.StatusOK, true)

	// Every operation of the document was exercised.
	for path, item := range c.doc.Paths.Map() {
		for method := range item.Operations() {
			found := false
			for k := range c.seen {
				if strings.HasPrefix(k, method+" "+path+" ") {
					found = true
				}
			}
			if !found {
				t.Errorf("%s %s is in the document but was never exercised", method, path)
			}
		}
	}
}

// TestOpenAPIRequestSchemasAreTheHandlers checks each write's request schema
// against the bodies the contract test sends: every member the schema has
// is sent (so the strict decoder vouches for it), and its required members
// are the ones the handler answers 400 without.
func TestOpenAPIRequestSchemasAreTheHandlers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := loadContract(t, e)
	acct := e.createAccount(keyA, 100, "KRW").ID
	full := map[string]string{
		"/v1/accounts":               `{"balance":1,"currency":"KRW"}`,
		"/v1/accounts/{id}/deposits": `{"amount":1}`,
		"/v1/payments":               payBody(acct, 1, "KRW"),
	}
	for tmpl, body := range full {
		op := c.doc.Paths.Value(tmpl).Post
		schema := op.RequestBody.Value.Content.Get("application/json").Schema.Value
		var members map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &members); err != nil {
			t.Fatal(err)
		}
		var names []string
		for n := range schema.Properties {
			names = append(names, n)
		}
		for n := range members {
			if !slices.Contains(names, n) {
				t.Errorf("%s: the body sends %q, which the schema lacks", tmpl, n)
			}
		}
		path := strings.Replace(tmpl, "{id}", acct, 1)
		for _, n := range names {
			if _, ok := members[n]; !ok {
				t.Errorf("%s: the schema has %q, which the test body does not send", tmpl, n)
			}
			// Without member n: refused exactly when the schema requires it.
			without := maps.Clone(members)
			delete(without, n)
			b, err := json.Marshal(without)
			if err != nil {
				t.Fatal(err)
			}
			required := slices.Contains(schema.Required, n)
			want := http.StatusCreated
			if required {
				want = http.StatusBadRequest
			}
			c.check(req{method: "POST", path: path, idemKey: "without-" + n + "-" + strings.ReplaceAll(tmpl, "/", "_"), body: string(b)}, want, !required)
		}
	}
}

// TestOpenAPIPublishesEachWritesPolicy checks x-idempotency and the
// Idempotency-Key parameter of the three protected writes against the
// service's configuration.
func TestOpenAPIPublishesEachWritesPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *payments.Config) {
		c.KeyTTL = 3 * time.Hour
		c.KeyLease = 20 * time.Second
	})
	c := loadContract(t, e)
	for tmpl, required := range map[string]bool{"/v1/accounts": false, "/v1/accounts/{id}/deposits": true, "/v1/payments": true, "/v1/refunds": true} {
		op := c.doc.Paths.Value(tmpl).Post
		p := op.Parameters.GetByInAndName("header", "Idempotency-Key")
		if p == nil || p.Required != required {
			t.Errorf("%s: Idempotency-Key parameter = %+v, want required %v", tmpl, p, required)
		}
		var x struct {
			Required bool    `json:"required"`
			Expiry   float64 `json:"expiry"`
			Lease    float64 `json:"lease"`
		}
		raw, _ := json.Marshal(op.Extensions["x-idempotency"])
		if err := json.Unmarshal(raw, &x); err != nil {
			t.Fatalf("%s: x-idempotency %s: %v", tmpl, raw, err)
		}
		if x.Required != required || x.Expiry != 3*3600 || x.Lease != 20 {
			t.Errorf("%s: x-idempotency = %s, want required %v, expiry 10800, lease 20", tmpl, raw, required)
		}
		for _, status := range []string{"400", "409", "413", "422", "503"} {
			if op.Responses.Value(status) == nil {
				t.Errorf("%s: no %s answer", tmpl, status)
			}
		}
	}
	if c.doc.Components.SecuritySchemes["apiKey"] == nil || c.doc.Components.SecuritySchemes["apiKey"].Value.Scheme != "bearer" {
		t.Errorf("no bearer security scheme: %+v", c.doc.Components.SecuritySchemes)
	}
}

// TestOpenAPIDescribesInFlightAndTransientAnswers checks the answers that
// need a request held in flight (409 with Retry-After, from the middleware)
// or a transient failure (503 with Retry-After, from the handler) against
// the document.
func TestOpenAPIDescribesInFlightAndTransientAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *payments.Config) { c.InflightWait = 50 * time.Millisecond })
	c := loadContract(t, e)
	acct := e.createAccount(keyA, 1000, "KRW").ID
	pay := payBody(acct, 10, "KRW")

	first := make(chan resp, 1)
	go func() {
		r, err := e.send(req{method: "POST", path: "/v1/payments", idemKey: "held", body: pay, fault: "delay=1s"})
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		first <- r
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !e.inFlight(tenantA, "held") {
		if time.Now().After(deadline) {
			t.Fatal("the held request never went in flight")
		}
	}
	dup := c.check(req{method: "POST", path: "/v1/payments", idemKey: "held", body: pay}, http.StatusConflict, true)
	if dup.header.Get("Retry-After") == "" {
		t.Errorf("409 without Retry-After: %v", dup.header)
	}
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("held request = %s, want 201", r)
	}
	c.check(req{method: "POST", path: "/v1/payments", idemKey: "transient", body: pay, fault: "fail-before-commit"}, http.StatusServiceUnavailable, true)
	c.check(req{method: "POST", path: "/v1/accounts/" + acct + "/deposits", idemKey: "transient-dep", body: `{"amount":1}`, fault: "fail-before-commit"}, http.StatusServiceUnavailable, true)
}
