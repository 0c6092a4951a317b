package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A payment in flight at its recovery point (its replica killed after the
// card network charged it) while `idem keys seal` rewrites the keys and
// seals the answers and points, then resumed by a replica that runs with
// both secrets: the card network charged once, and `idem reconcile` finds
// the payment and its one charge in agreement. The charge key derives from
// the tenant and the client's key, which sealing does not change.
func TestSealWhileAPaymentIsInFlight(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		sealWhileInFlight(t, []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		u := postgresURL(t)
		sealWhileInFlight(t, []string{"--db", u, "--pg-schema", freshSchema(t, u)})
	})
}

// sealWhileInFlight is TestSealWhileAPaymentIsInFlight on the database
// db (its --db and --pg-schema flags).
func sealWhileInFlight(t *testing.T, db []string) {
	hs := startCardNetwork(t)
	args := append(append([]string{}, db...), "--acquirer", hs.URL, "--faults", "--log-level", "warn")
	a := startReplica(t, "a", args)
	acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("creating the account: %s", acct)
	}
	pay := map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR", "description": "sealed while in flight"}
	crash(t, a, "pay-sealed-in-flight", pay)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the replica did not die after the charge")
	}

	secrets := map[string]string{envKeySecret: "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==",
		envBodyKeys: "k1:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}
	code, out, errOut := runWithEnv(t, secrets, append([]string{"keys", "seal"}, db...)...)
	if code != exitOK || !strings.Contains(out, "sealed 2 idempotency keys") {
		t.Fatalf("keys seal: exit %d, %q, %q; want the account's and the payment's keys sealed", code, out, errOut)
	}

	for k, v := range secrets {
		a.env = append(a.env, k+"="+v)
	}
	a.start(t)
	r := retryUntilAnswered(t, a, "pay-sealed-in-flight", pay, 30*time.Second)
	if r.status != http.StatusCreated || r.body["charge_id"] == nil || r.body["charge_id"] == "" {
		t.Fatalf("the retry after sealing: %s; want 201 with the charge", r)
	}
	if again := a.post(t, "/v1/payments", "pay-sealed-in-flight", "", pay); again.status != http.StatusCreated || again.body["charge_id"] != r.body["charge_id"] {
		t.Fatalf("the replay: %s; want the same payment", again)
	}
	a.stop(t)

	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, db...), "--acquirer", hs.URL, "--acquirer-key", "net-key")...)
	t.Logf("reconcile: %s", strings.TrimSpace(out))
	if code != exitOK || !strings.Contains(out, "1 payments") || !strings.Contains(out, "1 charges") || !strings.Contains(out, "0 differences") {
		t.Fatalf("reconcile: exit %d, %q, %q; want one payment, one charge, 0 differences", code, out, errOut)
	}
}
