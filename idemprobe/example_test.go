package idemprobe_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprobe"
)

// newOrders is an endpoint built on idemhttp: every POST creates an order,
// at most once per key.
func newOrders() http.Handler {
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err != nil {
		panic(err)
	}
	var n atomic.Int64
	return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ord_%d"}`, n.Add(1))
	}))
}

// Probing a handler built on idemhttp, served in-process: every applicable
// check passes. The checks that need the server's help (a fault that makes
// it answer 5xx, a delay that keeps a request in flight, a second
// credential) are not applicable without the options that give it. In a
// test, idemprobe.Test(t, cfg) makes each check a subtest instead.
func Example() {
	rep, err := idemprobe.Run(context.Background(), &idemprobe.Config{
		Handler: newOrders(),
		URL:     "/v1/orders",
		Body:    `{"amount":{{n}}}`,
	})
	if err != nil {
		panic(err)
	}
	for _, c := range rep.Checks {
		fmt.Println(c.Name, c.Status)
	}
	fmt.Println("all applicable checks pass:", rep.OK())
	// Output:
	// concurrent-duplicates pass
	// sequential-replay pass
	// key-reuse-refused pass
	// missing-key-refused pass
	// malformed-key-refused pass
	// lost-response pass
	// no-credentials-replayed pass
	// 5xx-not-kept n/a
	// in-flight-duplicate n/a
	// scope-isolation n/a
	// revoked-credential n/a
	// key-expiry n/a
	// history-linearizable n/a
	// all applicable checks pass: true
}

// A rule of the API's own, written as a case: a retry is marked as a
// replay, and a second key is a second order. The draft's core behaviours
// come as cases too, each citing its section.
func ExampleCase() {
	own := idemprobe.Case{
		Name:   "orders-retry-marked",
		Title:  "a retried order is marked as a replay; another key is another order",
		Source: "the orders API guide, Retries",
		Steps: []idemprobe.Step{
			{Name: "first", Want: idemprobe.Want{Status: []int{201}}},
			{Name: "retry", Want: idemprobe.Want{Same: "first", Replayed: true}},
			{Name: "next-order", Key: "next", Want: idemprobe.Want{Status: []int{201}, Other: "first"}},
		},
		Pass: "the retry was replayed, the next order ran",
	}
	rep, err := idemprobe.Run(context.Background(), &idemprobe.Config{
		Handler: newOrders(),
		URL:     "/v1/orders",
		Body:    `{"amount":{{n}}}`,
		Cases:   append([]idemprobe.Case{own}, idemprobe.DraftCases()...),
	})
	if err != nil {
		panic(err)
	}
	for _, c := range rep.Checks[13:] {
		fmt.Printf("%d %s %s: %s\n", c.Number, c.Name, c.Status, c.Source)
	}
	// Output:
	// 13 orders-retry-marked pass: the orders API guide, Retries
	// 14 draft-retry-replayed pass: draft-ietf-httpapi-idempotency-key-header-07 §2.6 Idempotency Enforcement (Retry: the resource SHOULD respond with the result of the previously completed operation)
	// 15 draft-concurrent-conflict n/a: draft-ietf-httpapi-idempotency-key-header-07 §2.6 Idempotency Enforcement (Concurrent Request: the resource SHOULD respond with a resource conflict error), §2.7 Error Handling (409 for a request retried while the original is still being processed)
	// 16 draft-missing-key pass: draft-ietf-httpapi-idempotency-key-header-07 §2.7 Error Handling (400 when the key is missing for an operation that requires it)
	// 17 draft-payload-mismatch pass: draft-ietf-httpapi-idempotency-key-header-07 §2.2 Uniqueness of Idempotency Key (a key MUST NOT be reused with a different payload), §2.4 Idempotency Fingerprint, §2.7 Error Handling (422 for a key reused with a different payload)
	// 18 draft-corrected-retry pass: draft-ietf-httpapi-idempotency-key-header-07 §2.7 Error Handling (clients MUST correct the request before retrying it, or the resource MUST fail the request), §2.6 Idempotency Enforcement (Retry)
	// 19 draft-sf-string-key pass: draft-ietf-httpapi-idempotency-key-header-07 §2.1 Syntax (the value is an Item Structured Header whose value MUST be a String)
	// 20 draft-invalid-key pass: draft-ietf-httpapi-idempotency-key-header-07 §2.1 Syntax (a String), §5 Security Considerations (always validate the key before processing any request)
	// 21 draft-scoped-key n/a: draft-ietf-httpapi-idempotency-key-header-07 §5 Security Considerations (a composite key: the client's key and attributes of the client known only to the resource)
}

// Strict holds a duplicate in flight to the draft's 409: idemhttp, which
// lets it wait for the first answer by default, passes once its
// InflightWait is negative.
func ExampleConfig_strict() {
	for _, wait := range []time.Duration{0, -1} {
		// The request with X-Slow is held in flight until its duplicate
		// has met it there (meetings, an Observer of this package's
		// tests), so that the duplicate's answer is idemhttp's choice and
		// not the scheduler's.
		met := newMeetings()
		m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), InflightWait: wait, Observer: met})
		if err != nil {
			panic(err)
		}
		slow := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Slow") != "" {
				met.hold(r)
			}
			w.WriteHeader(http.StatusCreated)
		}))
		rep, err := idemprobe.Run(context.Background(), &idemprobe.Config{
			Handler:    slow,
			Body:       `{"amount":{{n}}}`,
			SlowHeader: "X-Slow: 1",
			Strict:     true,
			Cases:      idemprobe.DraftCases()[1:2], // draft-concurrent-conflict
		})
		if err != nil {
			panic(err)
		}
		for _, c := range rep.Checks {
			if c.Name == "in-flight-duplicate" || c.Name == "draft-concurrent-conflict" {
				fmt.Printf("InflightWait %v: %s %s\n", wait, c.Name, c.Status)
			}
		}
	}
	// Output:
	// InflightWait 0s: in-flight-duplicate fail
	// InflightWait 0s: draft-concurrent-conflict fail
	// InflightWait -1ns: in-flight-duplicate pass
	// InflightWait -1ns: draft-concurrent-conflict pass
}
