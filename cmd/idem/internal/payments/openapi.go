package payments

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// The request bodies of the API, as the handlers in api.go decode them.
// The document's request schemas are derived from these; the contract test
// sends every member of each to the service, whose strict decoder refuses
// a member it does not know. A field tagged required:"true" must be
// present; the handlers answer 400 when it is not.
type (
	createAccountRequest struct {
		Balance  int64  `json:"balance"`
		Currency string `json:"currency" required:"true"`
	}
	createDepositRequest struct {
		Amount int64 `json:"amount" required:"true"`
	}
	createPaymentRequest struct {
		AccountID   string `json:"account_id" required:"true"`
		Amount      int64  `json:"amount" required:"true"`
		Currency    string `json:"currency" required:"true"`
		Description string `json:"description"`
	}
	createRefundRequest struct {
		PaymentID string `json:"payment_id" required:"true"`
		Amount    int64  `json:"amount"`
		Reason    string `json:"reason"`
	}
	// paymentList is the answer of GET /v1/accounts/{id}/payments.
	paymentList struct {
		Data    []Payment `json:"data"`
		HasMore bool      `json:"has_more"`
	}
	// depositList is the answer of GET /v1/accounts/{id}/deposits.
	depositList struct {
		Data    []Deposit `json:"data"`
		HasMore bool      `json:"has_more"`
	}
)

// requestConstraints are what the handlers check of a request member,
// beyond its JSON type, in JSON Schema terms. A description's limit is in
// bytes, which JSON Schema cannot say, so it is told in words only.
var requestConstraints = map[string]map[string]any{
	"balance":    {"minimum": 0, "description": "Opening balance in minor units. Defaults to 0."},
	"currency":   {"pattern": "^[A-Z]{3}$", "description": "Three upper-case letters (ISO 4217-shaped)."},
	"amount":     {"minimum": 1, "description": "A positive integer of minor units."},
	"account_id": {"minLength": 1},
	"payment_id": {"minLength": 1},
	"reason": {"description": "At most " + strconv.Itoa(MaxDescriptionLen) +
		" bytes of UTF-8, without control characters."},
	"description": {"description": "At most " + strconv.Itoa(MaxDescriptionLen) +
		" bytes of UTF-8, without control characters."},
}

// openAPIHandler serves the API's OpenAPI 3.1 document, built once: it
// describes this service as configured (its middlewares' policies, unsafe
// mode's lack of them).
func (s *Service) openAPIHandler() http.Handler {
	body, err := json.MarshalIndent(s.openAPIDocument(), "", "  ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err != nil {
			writeProblem(w, http.StatusInternalServerError, "internal", "Internal error", "the API document could not be encoded", nil)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(append(body, '\n'))
	})
}

// openAPIDocument is the whole API as an OpenAPI 3.1 document, as plain
// JSON values (see idemhttp.OpenAPIFragment for why no library's types).
func (s *Service) openAPIDocument() map[string]any {
	schemas := map[string]any{
		"Account":              schemaOf(reflect.TypeFor[Account](), false),
		"Deposit":              schemaOf(reflect.TypeFor[Deposit](), false),
		"Payment":              schemaOf(reflect.TypeFor[Payment](), false),
		"PaymentList":          schemaOf(reflect.TypeFor[paymentList](), false),
		"DepositList":          schemaOf(reflect.TypeFor[depositList](), false),
		"Refund":               schemaOf(reflect.TypeFor[Refund](), false),
		"CreateRefundRequest":  schemaOf(reflect.TypeFor[createRefundRequest](), true),
		"Settlement":           schemaOf(reflect.TypeFor[Settlement](), false),
		"CreateAccountRequest": schemaOf(reflect.TypeFor[createAccountRequest](), true),
		"CreateDepositRequest": schemaOf(reflect.TypeFor[createDepositRequest](), true),
		"CreatePaymentRequest": schemaOf(reflect.TypeFor[createPaymentRequest](), true),
		"Problem":              idemhttp.ProblemSchema(),
	}
	idParam := func(what string) map[string]any {
		return map[string]any{"name": "id", "in": "path", "required": true,
			"description": "The " + what + "'s ID.", "schema": map[string]any{"type": "string"}}
	}
	secured := func(op map[string]any) map[string]any {
		op["security"] = []any{map[string]any{"apiKey": []any{}}}
		responses := op["responses"].(map[string]any)
		responses["401"] = problemResponse("The API key is missing or not valid.", false, map[string]any{
			"WWW-Authenticate": map[string]any{"required": true, "schema": map[string]any{"type": "string"}},
		})
		responses["500"] = problemResponse("The request failed inside; retry it with the same Idempotency-Key.", false, nil)
		// Transient failures and the request timeout.
		responses["503"] = problemResponse("The request failed before anything was committed, "+
			"or did not finish in time; retry it with the same Idempotency-Key.", true, nil)
		return op
	}
	write := func(mw *idemhttp.Middleware, op map[string]any) map[string]any {
		op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
			"application/json": map[string]any{"schema": op["x-request"]},
		}}
		delete(op, "x-request")
		responses := op["responses"].(map[string]any)
		responses["400"] = problemResponse("The body is not a valid request (see the problem's detail and field).", false, nil)
		responses["413"] = problemResponse("The body exceeds "+strconv.Itoa(MaxBodyBytes)+" bytes.", false, nil)
		secured(op)
		if mw != nil {
			mw.Policy().OpenAPI().ApplyTo(op)
		}
		return op
	}
	// listParams are a paginated list's query parameters, as Stripe's.
	listParams := func(what, prefix string) []any {
		cursor := func(name, desc string) map[string]any {
			return map[string]any{"name": name, "in": "query", "required": false, "description": desc,
				"schema": map[string]any{"type": "string", "pattern": "^" + prefix + "[a-z0-9]+$", "maxLength": maxIDLen}}
		}
		return []any{idParam("account"), map[string]any{
			"name": "limit", "in": "query", "required": false,
			"description": "How many " + what + "s at most. Defaults to " + strconv.Itoa(defaultListLimit) + ".",
			"schema":      map[string]any{"type": "integer", "minimum": 1, "maximum": maxListLimit},
		},
			cursor("starting_after", "The ID of a "+what+" of the account: the page holds those older than it. Not with ending_before."),
			cursor("ending_before", "The ID of a "+what+" of the account: the page holds those newer than it, still newest first. Not with starting_after."),
		}
	}
	listResponses := func(what, schema string) map[string]any {
		return map[string]any{
			"200": jsonResponse("The "+what+"s, newest first by (created_at, id); has_more says that more exist beyond the page "+
				"in the direction walked (older ones, or newer ones with ending_before).", schema, nil),
			"400": problemResponse("The limit is not an integer from 1 to "+strconv.Itoa(maxListLimit)+
				", or a cursor is malformed, names no "+what+" of this account, or both cursors are given.", false, nil),
			"404": problemResponse("No such account for this API key.", false, nil),
		}
	}
	location := map[string]any{"Location": map[string]any{
		"description": "The path of the resource made.", "required": true, "schema": map[string]any{"type": "string"}}}

	paths := map[string]any{
		"/v1/accounts": map[string]any{"post": write(s.accountsMW, map[string]any{
			"operationId": "createAccount", "summary": "Open an account",
			"x-request": ref("CreateAccountRequest"),
			"responses": map[string]any{
				"201": jsonResponse("The account.", "Account", location),
			},
		})},
		"/v1/accounts/{id}": map[string]any{"get": secured(map[string]any{
			"operationId": "getAccount", "summary": "An account and its balance",
			"parameters": []any{idParam("account")},
			"responses": map[string]any{
				"200": jsonResponse("The account.", "Account", nil),
				"404": problemResponse("No such account for this API key.", false, nil),
			},
		})},
		"/v1/accounts/{id}/deposits": map[string]any{"post": write(s.depositsMW, map[string]any{
			"operationId": "createDeposit", "summary": "Add money to an account",
			"parameters": []any{idParam("account")},
			"x-request":  ref("CreateDepositRequest"),
			"responses": map[string]any{
				"201": jsonResponse("The deposit, with the account's balance right after it.", "Deposit", nil),
				"404": problemResponse("No such account for this API key.", false, nil),
				"409": problemResponse("The deposit would take the balance past the largest amount that can be held.", false, nil),
			},
		}), "get": secured(map[string]any{
			"operationId": "listDeposits", "summary": "An account's deposits, newest first",
			"parameters": listParams("deposit", "dep_"),
			"responses":  listResponses("deposit", "DepositList"),
		})},
		"/v1/accounts/{id}/payments": map[string]any{"get": secured(map[string]any{
			"operationId": "listPayments", "summary": "An account's payments, newest first",
			"parameters": listParams("payment", "pay_"),
			"responses":  listResponses("payment", "PaymentList"),
		})},
		"/v1/payments": map[string]any{"post": write(s.paymentsMW, map[string]any{
			"operationId": "createPayment", "summary": "Charge an account",
			"x-request": ref("CreatePaymentRequest"),
			"responses": map[string]any{
				"201": jsonResponse("The payment.", "Payment", location),
				"402": problemResponse("The account's balance is smaller than the amount.", false, nil),
				"404": problemResponse("No such account for this API key.", false, nil),
				"422": problemResponse("An earlier execution of this Idempotency-Key recorded a different payment.", false, nil),
			},
		})},
		"/v1/payments/{id}": map[string]any{"get": secured(map[string]any{
			"operationId": "getPayment", "summary": "A payment",
			"parameters": []any{idParam("payment")},
			"responses": map[string]any{
				"200": jsonResponse("The payment.", "Payment", nil),
				"404": problemResponse("No such payment for this API key.", false, nil),
			},
		})},
		"/v1/refunds": map[string]any{"post": write(s.refundsMW, map[string]any{
			"operationId": "createRefund", "summary": "Give part or all of a payment back to its account",
			"x-request": ref("CreateRefundRequest"),
			"responses": map[string]any{
				"201": jsonResponse("The refund; without an amount, of what is left of the payment.", "Refund", location),
				"404": problemResponse("No such payment for this API key.", false, nil),
				"409": problemResponse("The payment's refunds would sum past its amount (refund-exceeds-payment), "+
					"or the refund would take the balance past the largest amount that can be held.", false, nil),
				"422": problemResponse("An earlier execution of this Idempotency-Key recorded a different refund.", false, nil),
			},
		})},
		"/v1/refunds/{id}": map[string]any{"get": secured(map[string]any{
			"operationId": "getRefund", "summary": "A refund",
			"parameters": []any{idParam("refund")},
			"responses": map[string]any{
				"200": jsonResponse("The refund.", "Refund", nil),
				"404": problemResponse("No such refund for this API key.", false, nil),
			},
		})},
		"/v1/settlement": map[string]any{"get": secured(map[string]any{
			"operationId": "getSettlement", "summary": "What the settlement consumer has settled, in the tenant's first account's currency",
			"responses": map[string]any{
				"200": jsonResponse("The settlement; all zero before the tenant has an account.", "Settlement", nil),
			},
		})},
		"/healthz": map[string]any{"get": probeOperation("healthz", "The process is alive and its database answers a read.", "ok")},
		"/readyz":  map[string]any{"get": probeOperation("readyz", "A write to the database commits, durably.", "ready")},
		"/metrics": map[string]any{"get": map[string]any{
			"operationId": "metrics", "summary": "Prometheus metrics", "security": []any{},
			"responses": map[string]any{"200": map[string]any{
				"description": "The metrics, in Prometheus' text or OpenMetrics format as the Accept header asks.",
				"content":     map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}},
			}},
		}},
		"/openapi.json": map[string]any{"get": map[string]any{
			"operationId": "openAPI", "summary": "This document", "security": []any{},
			"responses": map[string]any{"200": map[string]any{
				"description": "The API as an OpenAPI 3.1 document.",
				"content":     map[string]any{"application/json": map[string]any{"schema": map[string]any{"type": "object"}}},
			}},
		}},
	}
	info := map[string]any{
		"title":   "idem payments",
		"version": "1",
		"description": "The reference payment service of idem. Writes are made idempotent with the Idempotency-Key " +
			"header (draft-ietf-httpapi-idempotency-key-header); each protected operation publishes its policy in " +
			"x-idempotency. Every error is an RFC 9457 application/problem+json document whose type is " + ProblemTypePrefix + "<slug>.",
	}
	if s.unsafe {
		info["description"] = info["description"].(string) + " UNSAFE MODE: idempotency keys are ignored and every duplicate charges again."
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info":    info,
		"servers": []any{map[string]any{"url": "/"}},
		"paths":   paths,
		"components": map[string]any{
			"schemas": schemas,
			"securitySchemes": map[string]any{"apiKey": map[string]any{
				"type": "http", "scheme": "bearer", "description": "An API key, which names the tenant.",
			}},
		},
		"security": []any{map[string]any{"apiKey": []any{}}},
	}
}

func probeOperation(name, summary, status string) map[string]any {
	return map[string]any{
		"operationId": name, "summary": summary, "security": []any{},
		"responses": map[string]any{
			"200": map[string]any{"description": summary, "content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"type": "object", "required": []any{"status"}, "additionalProperties": false,
					"properties": map[string]any{"status": map[string]any{"type": "string", "const": status}}},
			}}},
			"503": problemResponse("The database did not answer in time.", false, nil),
		},
	}
}

func ref(name string) map[string]any { return map[string]any{"$ref": "#/components/schemas/" + name} }

func jsonResponse(desc, schema string, headers map[string]any) map[string]any {
	r := map[string]any{"description": desc, "content": map[string]any{
		"application/json": map[string]any{"schema": ref(schema)},
	}}
	if headers != nil {
		h := map[string]any{}
		for k, v := range headers {
			h[k] = v
		}
		r["headers"] = h
	}
	return r
}

func problemResponse(desc string, retryAfter bool, headers map[string]any) map[string]any {
	h := map[string]any{}
	for k, v := range headers {
		h[k] = v
	}
	if retryAfter {
		h["Retry-After"] = map[string]any{"description": "Seconds to wait before retrying.", "required": true,
			"schema": map[string]any{"type": "integer", "minimum": 0}}
	}
	r := map[string]any{"description": desc, "content": map[string]any{
		idemhttp.ProblemContentType: map[string]any{"schema": ref("Problem")},
	}}
	if len(h) > 0 {
		r["headers"] = h
	}
	return r
}

var timeType = reflect.TypeFor[time.Time]()

// schemaOf derives a JSON Schema from a Go type as encoding/json writes it:
// a struct's members are its json tags ("-" left out). Answers always carry
// every member, so all are required and no others appear; of a request,
// only the members tagged required:"true" are, and requestConstraints add
// what the handlers check.
func schemaOf(t reflect.Type, request bool) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t.Kind() == reflect.Pointer:
		return schemaOf(t.Elem(), request)
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		s := map[string]any{"type": "integer"}
		if t.Size() == 8 {
			s["format"] = "int64"
		}
		return s
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		// encoding/json writes a nil slice as null.
		return map[string]any{"type": []any{"array", "null"}, "items": schemaOf(t.Elem(), request)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), request)}
	case reflect.Struct:
		props := map[string]any{}
		required := []any{}
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" && opts == "" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			ps := schemaOf(f.Type, request)
			if request {
				for k, v := range requestConstraints[name] {
					ps[k] = v
				}
			}
			props[name] = ps
			if (request && f.Tag.Get("required") == "true") || (!request && !strings.Contains(opts, "omitempty")) {
				required = append(required, name)
			}
		}
		return map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false}
	}
	return map[string]any{}
}
