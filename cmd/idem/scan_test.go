package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemsqlite"
)

// With both secrets set, after payments that crash at their point and are
// retried, complete, are refunded and are replayed: no raw Idempotency-Key
// is anywhere in the service's database files (SQLite's file and WAL), the
// card network's database, or any log line; and none of the text the
// payments carried (a description, a refund's reason) is in the card
// network's database or the logs.
func TestNoRawKeyAtRest(t *testing.T) {
	t.Parallel()
	netDir, svcDir := t.TempDir(), t.TempDir()
	netDB, err := idemsqlite.Open(filepath.Join(netDir, "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer netDB.Close()
	var netLog syncBuffer
	net, err := acquirer.New(t.Context(), acquirer.Config{DB: netDB, APIKey: "net-key", Logger: slog.New(slog.NewTextHandler(&netLog, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(net.Handler())
	defer hs.Close()

	dbURL := "sqlite:" + filepath.Join(svcDir, "idem.db")
	a := startReplica(t, "scan", []string{"--db", dbURL, "--acquirer", hs.URL, "--faults", "--log-level", "debug"})
	a.env = []string{envKeySecret + "=c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==",
		envBodyKeys + "=k1:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}
	a.stop(t)
	a.start(t)

	keys := []string{"raw-acct-key-31d0c7", "raw-pay-crash-4f1c9e", "raw-pay-ok-9a2e11", "raw-refund-77b1aa"}
	texts := []string{"quokka-description-7731", "wombat-refund-reason-5512"}
	acct := a.post(t, "/v1/accounts", keys[0], "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("account: %s", acct)
	}
	pay := map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR", "description": texts[0]}
	crash(t, a, keys[1], pay)
	a.restart(t)
	if r := retryUntilAnswered(t, a, keys[1], pay, 30*time.Second); r.status != http.StatusCreated {
		t.Fatalf("the crashed payment's retry: %s", r)
	}
	ok := a.post(t, "/v1/payments", keys[2], "", pay)
	if ok.status != http.StatusCreated {
		t.Fatalf("payment: %s", ok)
	}
	refund := map[string]any{"payment_id": ok.body["id"], "amount": 400, "reason": texts[1]}
	if r := a.post(t, "/v1/refunds", keys[3], "", refund); r.status != http.StatusCreated {
		t.Fatalf("refund: %s", r)
	}
	for _, k := range keys[1:3] {
		if r := a.post(t, "/v1/payments", k, "", pay); r.status != http.StatusCreated {
			t.Fatalf("replay of %s: %s", k, r)
		}
	}
	if r := a.post(t, "/v1/refunds", keys[3], "", refund); r.status != http.StatusCreated {
		t.Fatalf("refund's replay: %s", r)
	}
	a.stop(t)

	find := func(where string, b []byte, secrets []string) {
		t.Helper()
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q", where, s)
			}
		}
	}
	files := 0
	for _, dir := range []string{svcDir, netDir} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files++
			find(e.Name(), b, keys)
			if dir == netDir {
				find("the card network's "+e.Name(), b, texts)
			}
		}
	}
	if files < 3 {
		t.Fatalf("scanned %d files; want the service's database and WAL and the card network's", files)
	}
	find("the service's log", []byte(a.log()), append(keys, texts...))
	find("the card network's log", []byte(netLog.String()), append(keys, texts...))
	if !strings.Contains(a.log(), "level=") {
		t.Fatalf("the service logged nothing to scan:\n%s", a.log())
	}
}
