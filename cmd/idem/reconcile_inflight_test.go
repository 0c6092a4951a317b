package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A replica dies after the card network charged a payment and before the
// payment committed. Reconciled at once, while the completer is within its
// bound, the payment is being finished: not a difference, exit 0. Past the
// bound with no completer it is an unknown outcome: a difference, exit 1.
func TestReconcileInFlightPayment(t *testing.T) {
	t.Parallel()
	for name, db := range map[string]func(t *testing.T) []string{
		"sqlite": func(t *testing.T) []string {
			return []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
		},
		"postgres": func(t *testing.T) []string {
			u := postgresURL(t)
			return []string{"--db", u, "--pg-schema", freshSchema(t, u)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reconcileInFlight(t, db(t))
		})
	}
}

func reconcileInFlight(t *testing.T, dbArgs []string) {
	hs := startCardNetwork(t)
	a := startReplica(t, "a", append(append([]string{}, dbArgs...), "--acquirer", hs.URL, "--faults", "--log-level", "warn"))
	acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("creating the account: %s", acct)
	}
	crash(t, a, "pay-in-flight", map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR"})
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the replica did not die after the charge")
	}

	code, out, errOut := runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key")...)
	t.Logf("reconcile at once: %s", strings.TrimSpace(out))
	if code != exitOK || !strings.Contains(out, "0 differences") || !strings.Contains(out, "being finished") || !strings.Contains(out, "1 payment(s) being finished") {
		t.Fatalf("reconcile right after the crash: exit %d, %q, %q; want the payment being finished and exit 0", code, out, errOut)
	}
	// For automation: JSON lines, the payment pending, then the summary.
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--json")...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var first, last map[string]any
	if code != exitOK || len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &first) != nil || json.Unmarshal([]byte(lines[1]), &last) != nil ||
		first["type"] != "pending" || first["amount"] != float64(1000) || last["type"] != "summary" || last["differences"] != float64(0) || last["pending"] != float64(1) {
		t.Fatalf("reconcile --json: exit %d, %q, %q; want a pending object and a summary", code, out, errOut)
	}
	// A bound already past: no completer finished it in time.
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--bound", "1ns")...)
	t.Logf("reconcile past the bound: %s", strings.TrimSpace(out))
	if code != exitFailure || !strings.Contains(out, "unknown-outcome") || strings.Contains(out, "charge-without-payment") || !strings.Contains(out, "1 difference(s)") {
		t.Fatalf("reconcile past the bound: exit %d, %q, %q; want one unknown outcome and exit 1", code, out, errOut)
	}
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--bound", "1ns", "--json")...)
	if code != exitFailure || !strings.Contains(out, `{"type":"difference","kind":"unknown-outcome"`) || !strings.Contains(out, `"differences":1`) {
		t.Fatalf("reconcile --json past the bound: exit %d, %q, %q; want the unknown outcome as a difference object", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--bound", "0s")...); code != exitUsage || !strings.Contains(errOut, "--bound") {
		t.Fatalf("reconcile --bound 0s: exit %d, %q; want a usage error", code, errOut)
	}
}
