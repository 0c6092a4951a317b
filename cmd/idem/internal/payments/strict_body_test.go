package payments_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// A body that two JSON parsers could read differently is refused before
// anything runs: names differing from the API's only in case (which
// encoding/json would take for the field, the last one winning), names
// given twice, unknown names. Each is a 400 that names the member, and
// nothing is charged, credited or opened.
func TestAmbiguousBodiesAreRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		id := acct.ID
		tests := []struct {
			name, path, body, names string
		}{
			{"case-variant duplicate, the last one large", "/v1/payments",
				`{"amount":1,"AMOUNT":1000,"account_id":"` + id + `","currency":"KRW"}`, `"AMOUNT"`},
			{"case-variant duplicate, the first one large", "/v1/payments",
				`{"AMOUNT":1000,"account_id":"` + id + `","amount":1,"currency":"KRW"}`, `"AMOUNT"`},
			{"case variant alone", "/v1/payments",
				`{"account_id":"` + id + `","Amount":1000,"currency":"KRW"}`, `"Amount"`},
			{"case variant spelt with an escape", "/v1/payments",
				`{"account_id":"` + id + `","\u0041mount":1000,"currency":"KRW"}`, `"Amount"`},
			{"exact duplicate", "/v1/payments",
				`{"account_id":"` + id + `","amount":1,"amount":1000,"currency":"KRW"}`, `"amount"`},
			{"duplicate of a name spelt with an escape", "/v1/payments",
				`{"account_id":"` + id + `","amount":1,"\u0061mount":1000,"currency":"KRW"}`, `"amount"`},
			// encoding/json folds U+017F LATIN SMALL LETTER LONG S to 's'.
			{"Unicode case variant", "/v1/payments",
				`{"account_id":"` + id + `","amount":1,"currency":"KRW","deſcription":"x"}`, `"deſcription"`},
			{"unknown field", "/v1/payments",
				`{"account_id":"` + id + `","amount":1,"currency":"KRW","tip":5}`, `"tip"`},
			{"deposit, case-variant duplicate", "/v1/accounts/" + id + "/deposits",
				`{"amount":1,"AMOUNT":1000}`, `"AMOUNT"`},
			{"deposit, exact duplicate", "/v1/accounts/" + id + "/deposits",
				`{"amount":1000,"amount":1}`, `"amount"`},
			{"account, case-variant duplicate", "/v1/accounts",
				`{"balance":0,"BALANCE":5000,"currency":"KRW"}`, `"BALANCE"`},
			{"account, exact duplicate", "/v1/accounts",
				`{"currency":"KRW","currency":"USD"}`, `"currency"`},
		}
		for i, tt := range tests {
			r := e.do(req{method: "POST", path: tt.path, idemKey: fmt.Sprint("ambiguous-", i), body: tt.body})
			p := expectProblem(t, r, http.StatusBadRequest, "urn:idem:problem:invalid-request")
			if !strings.Contains(p.Detail, tt.names) {
				t.Errorf("%s: detail %q does not name %s", tt.name, p.Detail, tt.names)
			}
		}
		e.expectBalance(keyA, id, 10_000)
		e.expectPayments(keyA, id, 0)
		m := string(e.expect(req{method: "GET", path: "/metrics", apiKey: "-"}, http.StatusOK).body)
		for _, want := range []string{"payments_accounts 1", "payments_created_total 0", "payments_deposits_total 0"} {
			if !strings.Contains(m, want+"\n") {
				t.Errorf("/metrics lacks %q: an ambiguous body changed something", want)
			}
		}
	})
}

// The middleware fingerprints the canonical form of a JSON body, in which
// members are sorted by name: a body and its reordering are the same
// request to it. With a case-variant duplicate they were not the same to
// the decoder (the last member wins), so one could be answered with the
// other's payment. Both are refused, under one key, and nothing is charged.
func TestReorderedAmbiguousBodyUnderOneKeyIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		e := newEnvOn(t, on, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		large := `{"amount":1,"AMOUNT":1000,"account_id":"` + acct.ID + `","currency":"KRW"}`
		small := `{"AMOUNT":1000,"account_id":"` + acct.ID + `","amount":1,"currency":"KRW"}`
		for _, body := range []string{large, small, large} {
			r := e.do(req{method: "POST", path: "/v1/payments", idemKey: "reordered", body: body})
			expectProblem(t, r, http.StatusBadRequest, "urn:idem:problem:invalid-request")
		}
		e.expectBalance(keyA, acct.ID, 10_000)
		e.expectPayments(keyA, acct.ID, 0)
		// The refusals kept nothing under the key: the request as it
		// should have been sent runs.
		ok := e.expect(req{method: "POST", path: "/v1/payments", idemKey: "reordered", body: payBody(acct.ID, 1, "KRW")}, http.StatusCreated)
		if ok.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the corrected request was replayed: %s", ok)
		}
		e.expectBalance(keyA, acct.ID, 9_999)
	})
}
