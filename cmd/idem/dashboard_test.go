package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// dashboardFacesSeries are the input series of TestDashboardShowsBothFaces,
// promtool's notation (a sample a minute): one middleware, "payments", on
// both faces, as a service that serves HTTP and gRPC with one name exports
// them. The faces' series differ only by their metric's name, so a query
// that joined the faces with "or" alone would keep the HTTP ones and drop
// their gRPC twins. The rates are 1/s for each 60 a minute; the gRPC face's
// latencies all fall in (0.1s, 1s], the HTTP face's in [0, 0.1s].
const dashboardFacesSeries = `
      - series: 'idem_http_requests_total{job="idem", middleware="payments", outcome="executed"}'
        values: '0+60x20'
      - series: 'idem_http_requests_total{job="idem", middleware="payments", outcome="replayed"}'
        values: '0+60x20'
      - series: 'idem_grpc_requests_total{job="idem", middleware="payments", outcome="executed"}'
        values: '0+180x20'
      - series: 'idem_grpc_requests_total{job="idem", middleware="payments", outcome="replayed"}'
        values: '0+60x20'
`

// dashboardHistogram returns the input series of a face's histogram
// family (idem_<face>_<name>_bucket) with the extra labels: all in
// [0, 0.1s] on HTTP, all in (0.1s, 1s] on gRPC.
func dashboardHistogram(name, labels string) string {
	var b strings.Builder
	for _, s := range []struct{ face, le, values string }{
		{"http", "0.1", "0+60x20"}, {"http", "+Inf", "0+60x20"},
		{"grpc", "0.1", "0x20"}, {"grpc", "1", "0+60x20"}, {"grpc", "+Inf", "0+60x20"},
	} {
		fmt.Fprintf(&b, "      - series: 'idem_%s_%s_bucket{job=\"idem\", middleware=\"payments\", %s, le=\"%s\"}'\n        values: '%s'\n",
			s.face, name, labels, s.le, s.values)
	}
	return b.String()
}

// Every dashboard panel that shows both faces (idemhttp's idem_http_…
// and idemgrpc's idem_grpc_…) shows each face's series, labelled face,
// when a middleware of the same name serves both: promtool evaluates the
// panels' queries ($job as "idem", $__rate_interval as 5m) on synthetic
// series of both faces and wants each face's figures.
func TestDashboardShowsBothFaces(t *testing.T) {
	t.Parallel()
	promtool := idemtest.RequireBinaries(t, "promtool")["promtool"]
	// What each panel's targets, in order, must show at 10m.
	want := map[string][]string{
		"Requests by outcome": {`
          - labels: '{face="http", middleware="payments", outcome="executed"}'
            value: 1
          - labels: '{face="http", middleware="payments", outcome="replayed"}'
            value: 1
          - labels: '{face="grpc", middleware="payments", outcome="executed"}'
            value: 3
          - labels: '{face="grpc", middleware="payments", outcome="replayed"}'
            value: 1`},
		"Replay ratio": {`
          - labels: '{face="http", middleware="payments"}'
            value: 0.5
          - labels: '{face="grpc", middleware="payments"}'
            value: 0.25`},
		"Request latency": {`
          - labels: '{face="http", middleware="payments"}'
            value: 0.05
          - labels: '{face="grpc", middleware="payments"}'
            value: 0.55`, `
          - labels: '{face="http", middleware="payments"}'
            value: 0.095
          - labels: '{face="grpc", middleware="payments"}'
            value: 0.955`, `
          - labels: '{face="http", middleware="payments"}'
            value: 0.099
          - labels: '{face="grpc", middleware="payments"}'
            value: 0.991`},
		"Phase latency (p95)": {`
          - labels: '{face="http", phase="claim"}'
            value: 0.095
          - labels: '{face="grpc", phase="claim"}'
            value: 0.955`},
		"Key store round trips (p95)": {`
          - labels: '{face="http", op="claim"}'
            value: 0.095
          - labels: '{face="grpc", op="claim"}'
            value: 0.955`},
	}

	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "idem.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []panel `json:"panels"`
	}
	var dash struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/idem.json: %v", err)
	}
	var tests strings.Builder
	tested := map[string]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				if !strings.Contains(tg.Expr, "idem_http_") || !strings.Contains(tg.Expr, "idem_grpc_") {
					continue
				}
				if i >= len(want[p.Title]) {
					t.Errorf("panel %q's query %d shows both faces: give TestDashboardShowsBothFaces what it must show", p.Title, i)
					continue
				}
				tested[p.Title] = true
				expr := strings.NewReplacer("$job", "idem", "$__rate_interval", "5m").Replace(tg.Expr)
				q, _ := json.Marshal(expr) // a JSON string is a YAML one
				fmt.Fprintf(&tests, "      - expr: %s\n        eval_time: 10m\n        exp_samples:%s\n", q, want[p.Title][i])
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for title := range want {
		if !tested[title] {
			t.Errorf("no query of panel %q shows both faces", title)
		}
	}
	file := "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:" + dashboardFacesSeries +
		dashboardHistogram("request_duration_seconds", `outcome="executed"`) +
		dashboardHistogram("phase_duration_seconds", `phase="claim"`) +
		dashboardHistogram("store_duration_seconds", `op="claim"`) +
		"    promql_expr_test:\n" + tests.String()
	path := filepath.Join(t.TempDir(), "dashboard_test.yml")
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), promtool, "test", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules (the dashboard's queries on both faces' series): %v\n%s", err, out)
	}
}
