package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"
)

// knownOutcomes are the outcome label values idem serve ever exports:
// idemhttp.Outcome values and the consumer's outcomes.
var knownOutcomes = map[string]bool{
	"executed": true, "replayed": true, "conflict": true, "mismatch": true, "released": true,
	"store_error": true, "lease_lost": true, "rejected": true, "aborted": true, "unfinished": true,
	"processed": true, "duplicate": true, "retried": true, "dead_lettered": true, "parked": true, "interrupted": true,
}

// exportedMetrics runs idem serve, charging cards at a card network (so its
// completer's figures are exported too) and with its gRPC face (so its
// idem_grpc_… figures are), sends it a payment, its retry and
// a payment the settlement consumer settles, and returns the metric
// families its /metrics exports, by name, with their types.
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	const apiKey = "test-key-metrics"
	net := startCardNetwork(t)
	srv := startServe(t, newApp(map[string]string{envAcquirerKey: "net-key"}), "--db", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"),
		"--api-keys", "acme:"+apiKey, "--log-level", "warn", "--acquirer", net.URL, "--grpc", "127.0.0.1:0")
	checkChargesOnce(t, srv, apiKey)
	idemtest.Eventually(t, 30*time.Second, "the settlement of the payment", func() bool {
		return metricValue(metricsOf(t, srv), `idem_consumer_messages_total{consumer="settlement",outcome="processed"}`) >= 1
	})
	exposition := metricsOf(t, srv)
	stopCleanly(t, srv)
	types := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(exposition, -1) {
		types[m[1]] = m[2]
	}
	return types
}

var (
	metricRef  = regexp.MustCompile(`\b(idem_[a-z_]+|payments_[a-z_]+)\b`)
	outcomeRef = regexp.MustCompile(`outcome="([^"]+)"`)
)

// checkQuery reports what of a PromQL query names no metric of exported
// (a histogram's _bucket, _sum and _count series included), or an outcome
// that is never counted.
func checkQuery(t *testing.T, where, q string, exported map[string]string) {
	t.Helper()
	names := metricRef.FindAllString(q, -1)
	if len(names) == 0 {
		t.Errorf("%s: %q names no idem metric", where, q)
	}
	for _, n := range names {
		if exported[n] != "" {
			continue
		}
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] == "histogram" {
				base = ""
				break
			}
		}
		if base != "" {
			t.Errorf("%s: %q: idem serve exports no metric %s", where, q, n)
		}
	}
	for _, m := range outcomeRef.FindAllStringSubmatch(q, -1) {
		if !knownOutcomes[m[1]] {
			t.Errorf("%s: %q: no outcome %q is ever counted", where, q, m[1])
		}
	}
}

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
	exported := exportedMetrics(t)
	for _, e := range exprs {
		checkQuery(t, "alerts.yml", e, exported)
	}
}

// The Grafana dashboard's every query must name metrics that `idem serve`
// exports: a panel on a misspelt series shows "No data" forever.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "idem.json"))
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr string `json:"expr"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/idem.json: %v", err)
	}
	exported := exportedMetrics(t)
	var walk func(ps []panel)
	queries := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries++
				checkQuery(t, "panel "+p.Title, tg.Expr, exported)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if s, _ := q["query"].(string); s != "" {
				queries++
				checkQuery(t, "variable "+v.Name, s, exported)
			}
		}
	}
	if dash.UID == "" || queries < 10 {
		t.Fatalf("dashboard uid %q with %d queries: want a uid and its panels' queries", dash.UID, queries)
	}
}

// promtool checks the rules and runs their unit tests
// (deploy/prometheus/alerts_test.yml): each alert fires on a synthetic
// failure and stays quiet on a healthy series.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	promtool := idemtest.RequireBinaries(t, "promtool")["promtool"]
	dir := filepath.Join("..", "..", "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
