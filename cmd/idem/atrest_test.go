package main

import (
	"bytes"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// runWithEnv runs the command line with env as its whole environment.
func runWithEnv(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := newApp(env)
	a.stdout, a.stderr = &out, &errOut
	code = a.run(t.Context(), args)
	return code, out.String(), errOut.String()
}

// A service that kept keys in clear is sealed by `idem keys seal` and then
// served with the secret: duplicates of earlier payments still replay, the
// kept answers are encrypted, and `idem keys show` finds a key from what the
// client sent.
func TestKeysSealThenServeSealed(t *testing.T) {
	t.Parallel()
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	const apiKey = "test-key-1"
	srv := startServe(t, newApp(nil), "--db", dbURL, "--api-keys", "acme:"+apiKey, "--log-level", "warn")
	paymentID := checkChargesOnce(t, srv, apiKey)
	stopCleanly(t, srv)

	env := map[string]string{
		envKeySecret: "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I=",
		envBodyKeys:  "k1:" + strings.Repeat("ab", 32),
	}
	if code, _, errOut := runWithEnv(t, nil, "keys", "seal", "--db", dbURL); code != exitUsage || !strings.Contains(errOut, envKeySecret) {
		t.Fatalf("seal without a secret: exit %d, stderr %q", code, errOut)
	}
	// The payment's origin is a digest of tenant and key already (the
	// service keeps no client's key in its tables), so only the key
	// store's records are rewritten.
	code, out, errOut := runWithEnv(t, env, "keys", "seal", "--db", dbURL)
	if code != exitOK || !strings.Contains(out, "idempotency keys, 0 payments'") || strings.Contains(out, "sealed 0 idempotency keys") {
		t.Fatalf("keys seal: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	srv = startServe(t, newApp(env), "--db", dbURL, "--api-keys", "acme:"+apiKey, "--log-level", "warn")
	var again paymentBody
	resp := srv.call(t, "POST", "/v1/payments", apiKey, "pay-1", map[string]any{"account_id": accountOf(t, srv, apiKey, paymentID), "amount": 12000, "currency": "KRW"}, &again)
	if resp.StatusCode != http.StatusCreated || again.ID != paymentID || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate after sealing: status %d, id %q (want %q), replayed %q", resp.StatusCode, again.ID, paymentID, resp.Header.Get("Idempotent-Replayed"))
	}
	var fresh paymentBody
	if resp := srv.call(t, "POST", "/v1/payments", apiKey, "pay-sealed", map[string]any{"account_id": accountOf(t, srv, apiKey, paymentID), "amount": 5, "currency": "KRW"}, &fresh); resp.StatusCode != http.StatusCreated {
		t.Fatalf("a new payment: status %d", resp.StatusCode)
	}
	stopCleanly(t, srv)

	code, out, errOut = runWithEnv(t, env, "keys", "show", "--db", dbURL, "--scope", "acme", "pay-sealed")
	if code != exitOK || !strings.Contains(out, "sealed as") || !strings.Contains(out, fresh.ID) {
		t.Fatalf("keys show of a sealed key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Without the body keys the kept answer is not shown, and says why.
	code, _, errOut = runWithEnv(t, map[string]string{envKeySecret: env[envKeySecret]}, "keys", "show", "--db", dbURL, "--scope", "acme", "pay-sealed")
	if code == exitOK || !strings.Contains(errOut, envBodyKeys) {
		t.Fatalf("keys show without the body keys: exit %d, stderr %q", code, errOut)
	}
	// Without the secret the key is not found, with a hint.
	code, _, errOut = runWithEnv(t, nil, "keys", "show", "--db", dbURL, "--scope", "acme", "pay-sealed")
	if code == exitOK || !strings.Contains(errOut, envKeySecret) {
		t.Fatalf("keys show without the secret: exit %d, stderr %q", code, errOut)
	}
}

func TestAtRestEnvRefused(t *testing.T) {
	t.Parallel()
	for name, env := range map[string]map[string]string{
		"short secret":      {envKeySecret: "abcd"},
		"not base64 or hex": {envKeySecret: "!!!!!!!!!!!!!!!!!!!!!!!!"},
		"body key no id":    {envBodyKeys: strings.Repeat("ab", 32)},
		"body key short":    {envBodyKeys: "k1:abcd"},
		"body key twice":    {envBodyKeys: "k1:" + strings.Repeat("ab", 32) + ",k1:" + strings.Repeat("cd", 32)},
	} {
		_, err := newApp(env).atRestFromEnv()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		for _, v := range env {
			if len(v) > 8 && strings.Contains(err.Error(), v) {
				t.Errorf("%s: the error shows the secret: %v", name, err)
			}
		}
	}
}

// accountOf returns the account a payment was taken from.
func accountOf(t *testing.T, srv *server, apiKey, paymentID string) string {
	t.Helper()
	var p struct {
		AccountID string `json:"account_id"`
	}
	if resp := srv.call(t, "GET", "/v1/payments/"+paymentID, apiKey, "", nil, &p); resp.StatusCode != http.StatusOK || p.AccountID == "" {
		t.Fatalf("GET /v1/payments/%s: status %d, account %q", paymentID, resp.StatusCode, p.AccountID)
	}
	return p.AccountID
}
