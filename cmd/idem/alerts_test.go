package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The alert rules shipped in deploy/ must name metrics and label values
// that `idem serve` really exports: a rule on a misspelt series never
// fires, and nobody notices.
func TestAlertRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for line := range strings.Lines(string(rules)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			exprs = append(exprs, v)
		}
	}
	if len(exprs) == 0 {
		t.Fatal("no expr: lines in alerts.yml")
	}

	const apiKey = "test-key-alerts"
	srv := startServe(t, newApp(nil), "--db", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "--api-keys", "acme:"+apiKey, "--log-level", "warn")
	var acct accountBody
	if resp := srv.call(t, "POST", "/v1/accounts", apiKey, "acct-1", map[string]any{"balance": 100, "currency": "KRW"}, &acct); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/accounts: status %d", resp.StatusCode)
	}
	exposition := metricsOf(t, srv)
	stopCleanly(t, srv)

	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) `).FindAllStringSubmatch(exposition, -1) {
		known[m[1]] = true
	}
	outcomes := map[string]bool{
		// idemhttp.Outcome values and the consumer's outcomes.
		"executed": true, "replayed": true, "conflict": true, "mismatch": true, "released": true,
		"store_error": true, "lease_lost": true, "rejected": true, "aborted": true,
		"processed": true, "duplicate": true, "retried": true, "dead_lettered": true, "parked": true,
	}
	metric := regexp.MustCompile(`\b(idem_[a-z_]+|payments_[a-z_]+)\b`)
	outcome := regexp.MustCompile(`outcome="([^"]+)"`)
	for _, e := range exprs {
		names := metric.FindAllString(e, -1)
		if len(names) == 0 {
			t.Errorf("rule %q names no idem metric", e)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("rule %q: idem serve exports no metric %s", e, n)
			}
		}
		for _, m := range outcome.FindAllStringSubmatch(e, -1) {
			if !outcomes[m[1]] {
				t.Errorf("rule %q: no outcome %q is ever counted", e, m[1])
			}
		}
	}
}
