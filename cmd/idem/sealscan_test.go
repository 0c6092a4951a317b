package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

// Records written before the secrets were set keep raw keys and text in
// clear; `idem keys seal` rewrites them, the gRPC face's with the HTTP
// face's, and leaves none of the old bytes in the SQLite file or its WAL
// (a row rewritten in place leaves its old content in free pages and WAL
// frames until they are reused).
func TestKeysSealLeavesNoRawKeyInTheFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "idem.db")
	a := startReplica(t, "sealscan", []string{"--db", db, "--grpc", "127.0.0.1:0"})
	keys := []string{"raw-before-acct-0b1e", "raw-before-http-7c2d", "raw-before-grpc-91fa"}
	texts := []string{"platypus-before-http-4410", "echidna-before-grpc-8821"}
	acct := a.post(t, "/v1/accounts", keys[0], "", map[string]any{"balance": 10000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("account: %s", acct)
	}
	if r := a.post(t, "/v1/payments", keys[1], "", map[string]any{"account_id": acct.body["id"], "amount": 100, "currency": "EUR", "description": texts[0]}); r.status != http.StatusCreated {
		t.Fatalf("payment: %s", r)
	}
	if g := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", keys[2], "", map[string]any{"account_id": acct.body["id"], "amount": 100, "currency": "EUR", "description": texts[1]}); g.err != nil {
		t.Fatalf("gRPC payment: %v", g.err)
	}
	a.stop(t)
	secrets := map[string]string{envKeySecret: "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==", envBodyKeys: "k1:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}
	code, out, errOut := runWithEnv(t, secrets, "keys", "seal", "--db", db)
	if code != exitOK {
		t.Fatalf("idem keys seal: %d\n%s%s", code, out, errOut)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range append(keys, texts...) {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q after idem keys seal (%s)", e.Name(), s, strings.TrimSpace(out))
			}
		}
	}
}
