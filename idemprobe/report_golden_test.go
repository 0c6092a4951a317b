package idemprobe_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/idemprobe"
)

var updateGolden = flag.Bool("probe.update", false, "rewrite the golden reports in testdata from this build")

// TestReportGolden compares whole reports, text and JSON, of runs against
// the fake endpoints with the ones in testdata, so that a change to how the
// probe is built shows up as any change to what it prints. Keys are made
// from a counter and the elapsed time is zeroed, so that only the server's
// port varies between runs, and it is replaced.
func TestReportGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		flaw   flaw
		adjust func(*idemprobe.Config)
	}{
		{"correct", correct, nil},
		{"correct-uncounted", correct, func(cfg *idemprobe.Config) { cfg.CountURL = "" }},
		{"mismatch-not-checked", noMismatchCheck, nil},
		{"credentials-replayed", replaysCookies, nil},
		{"5xx-kept", keeps5xx, nil},
		{"slow-header-ignored", correct, func(cfg *idemprobe.Config) { cfg.SlowHeader = "X-Ignored: 1" }},
		{"budget-spent", correct, func(cfg *idemprobe.Config) { cfg.MaxRequests = 25 }},
		{"5xx-every-key-kept", keeps5xxEveryKey, func(cfg *idemprobe.Config) { cfg.FaultHeader = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, srv := newFakeAPI(t, tc.flaw)
			cfg := fakeConfig(srv)
			var keys atomic.Int64
			cfg.NewKey = func() string { return fmt.Sprintf("golden-key-%d", keys.Add(1)) }
			if tc.adjust != nil {
				tc.adjust(cfg)
			}
			rep, err := idemprobe.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			rep.Elapsed = 0
			var js bytes.Buffer
			if err := rep.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			for _, out := range []struct{ ext, got string }{
				{"txt", text(t, rep)},
				{"json", sortConcurrentEvidence(t, js.Bytes())},
			} {
				got := strings.ReplaceAll(out.got, srv.URL, "http://fake")
				compareGolden(t, filepath.Join("testdata", "report-"+tc.name+"."+out.ext), got)
			}
		})
	}
}

// sortConcurrentEvidence sorts the exchanges of check 1: which of its
// duplicates ran and which were replayed is up to the scheduler, but not
// how many of each.
func sortConcurrentEvidence(t *testing.T, report []byte) string {
	t.Helper()
	var rep map[string]any
	d := json.NewDecoder(bytes.NewReader(report))
	d.UseNumber()
	if err := d.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	checks, _ := rep["checks"].([]any)
	for _, c := range checks {
		c, _ := c.(map[string]any)
		evidence, _ := c["evidence"].([]any)
		if c["name"] != "concurrent-duplicates" || len(evidence) == 0 {
			continue
		}
		keyed := make([]string, len(evidence))
		for i, ex := range evidence {
			b, err := json.Marshal(ex)
			if err != nil {
				t.Fatal(err)
			}
			keyed[i] = string(b)
		}
		slices.Sort(keyed)
		for i, k := range keyed {
			evidence[i] = json.RawMessage(k)
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func compareGolden(t *testing.T, path, got string) {
	t.Helper()
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -probe.update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("the report differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
