package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
)

// A --json run that fails partway (the card network stops answering after
// the first page of its charges) prints the differences it found, then a
// summary saying that it is incomplete and why, and exits 3; a run that
// ends says it is complete.
func TestReconcileJSONThatFailsPartwaySaysItIsIncomplete(t *testing.T) {
	t.Parallel()
	hs := startCardNetwork(t)
	net, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	// Charges no payment records: each a difference.
	for i := range 3 {
		if _, err := net.Charge(t.Context(), fmt.Sprint("stray-", i), acquirer.ChargeRequest{Amount: 100, Currency: "EUR", Reference: "acct-1",
			Metadata: map[string]string{"tenant": "acme"}}); err != nil {
			t.Fatal(err)
		}
	}
	// The network answers the first page of its charges, then no more.
	target, _ := url.Parse(hs.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/charges" && r.URL.Query().Get("starting_after") != "" {
			http.Error(w, "the network is down", http.StatusBadGateway)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(failing.Close)
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	if code, _, errOut := runCmd(t, "migrate", "--db", dbURL); code != exitOK {
		t.Fatalf("migrate: exit %d, %q", code, errOut)
	}

	summary := func(out string) map[string]any {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var s map[string]any
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil || s["type"] != "summary" {
			t.Fatalf("the last line is no summary object: %q (%v)", out, err)
		}
		return s
	}
	code, out, errOut := runCmd(t, "reconcile", "--db", dbURL, "--acquirer", failing.URL, "--acquirer-key", "net-key", "--window", "1", "--json")
	if code != exitUnreadable {
		t.Fatalf("reconcile --json against a network that fails after a page: exit %d, %q, %q; want %d", code, out, errOut, exitUnreadable)
	}
	s := summary(out)
	if s["complete"] != false || !strings.Contains(fmt.Sprint(s["error"]), "reading the network's charges") || s["differences"] != float64(1) || s["charges"] != float64(1) {
		t.Fatalf("the summary of a run that failed partway: %v; want it incomplete, saying why, with the 1 difference found", s)
	}
	if n := strings.Count(out, `"type":"difference"`); n != 1 {
		t.Fatalf("%d difference objects before the summary; want the 1 found:\n%s", n, out)
	}

	code, out, errOut = runCmd(t, "reconcile", "--db", dbURL, "--acquirer", hs.URL, "--acquirer-key", "net-key", "--window", "1", "--json")
	if s := summary(out); code != exitFailure || s["complete"] != true || s["differences"] != float64(3) || s["error"] != nil {
		t.Fatalf("reconcile --json that ends: exit %d, summary %v, %q; want it complete with 3 differences", code, s, errOut)
	}
}
