package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

// With both secrets set, after payments that crash at their point and are
// retried, complete, are refunded and are replayed, over HTTP and over the
// gRPC face (idem serve --grpc): no raw Idempotency-Key
// is anywhere in the service's database (SQLite's file and WAL; a pg_dump
// of its PostgreSQL schema), the card network's database, or any log line;
// and none of the text the payments carried (a description, a refund's
// reason) is in any of them either.
func TestNoRawKeyAtRest(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		scanAtRest(t, dir, []string{"--db", "sqlite:" + filepath.Join(dir, "idem.db")}, nil)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		u := postgresURL(t)
		schema := freshSchema(t, u)
		scanAtRest(t, "", []string{"--db", u, "--pg-schema", schema}, func() []byte {
			out, err := exec.Command("pg_dump", "--schema="+schema, "--dbname="+u).Output()
			if err != nil || len(out) == 0 {
				t.Fatalf("pg_dump: %v", err)
			}
			return out
		})
	})
}

// scanAtRest runs the payments with the service on db (its files in
// svcDir, when they are files) and scans what they left; dump, when
// given, is the database's dump.
func scanAtRest(t *testing.T, svcDir string, db []string, dump func() []byte) {
	netDir := t.TempDir()
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

	a := startReplica(t, "scan", append(db, "--acquirer", hs.URL, "--faults", "--log-level", "debug", "--grpc", "127.0.0.1:0"))
	a.env = []string{envKeySecret + "=c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==",
		envBodyKeys + "=k1:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}
	a.stop(t)
	a.start(t)

	keys := []string{"raw-acct-key-31d0c7", "raw-pay-crash-4f1c9e", "raw-pay-ok-9a2e11", "raw-refund-77b1aa",
		"raw-grpc-crash-5b2d8e", "raw-grpc-ok-c3f0a4", "raw-grpc-refund-e81d27"}
	texts := []string{"quokka-description-7731", "wombat-refund-reason-5512", "numbat-grpc-description-2290", "bilby-grpc-reason-6604"}
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

	// The same over gRPC: a payment that crashes at its point (after the
	// charge, before the commit) and is retried once the replica is back,
	// one that completes, a refund, and the replays of all three.
	gpay := map[string]any{"account_id": acct.body["id"], "amount": 700, "currency": "EUR", "description": texts[2]}
	if g := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", keys[4], "crash-after-charge", gpay); g.err == nil {
		t.Fatalf("crash-after-charge over gRPC answered %v; want the call cut off", g.out)
	}
	a.restart(t)
	if g := grpcRetryUntilAnswered(t, a, payments.GRPCCreatePayment, keys[4], gpay, 30*time.Second); g.err != nil {
		t.Fatalf("the crashed gRPC payment's retry: %v", g.err)
	}
	gok := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", keys[5], "", gpay)
	if gok.err != nil {
		t.Fatalf("gRPC payment: %v", gok.err)
	}
	grefund := map[string]any{"payment_id": gok.out.Fields["id"].GetStringValue(), "amount": 300, "reason": texts[3]}
	if g := a.grpcCall(t, payments.GRPCCreateRefund, "test-key", keys[6], "", grefund); g.err != nil {
		t.Fatalf("gRPC refund: %v", g.err)
	}
	for _, k := range keys[4:6] {
		if g := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", k, "", gpay); g.err != nil || !g.replayed() || g.out.Fields["description"].GetStringValue() != texts[2] {
			t.Fatalf("gRPC replay of %s: %v, %v (replayed %v)", k, g.out, g.err, g.replayed())
		}
	}
	if g := a.grpcCall(t, payments.GRPCCreateRefund, "test-key", keys[6], "", grefund); g.err != nil || !g.replayed() {
		t.Fatalf("gRPC refund's replay: %v, %v", g.out, g.err)
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
	dirs := []string{netDir}
	if svcDir != "" {
		dirs = append(dirs, svcDir)
	}
	sealed := false // the scan saw the service's records: their sealed keys
	if dump != nil {
		b := dump()
		find("pg_dump of the service's schema", b, append(keys, texts...))
		sealed = bytes.Contains(b, []byte("hk1_"))
		files += 2
	}
	for _, dir := range dirs {
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
			find(e.Name(), b, append(keys, texts...))
			sealed = sealed || dir != netDir && bytes.Contains(b, []byte("hk1_"))
		}
	}
	if !sealed {
		t.Fatal("no sealed key in what was scanned: not the service's records")
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
