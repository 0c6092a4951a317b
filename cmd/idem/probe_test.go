package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// probeServe starts serve with args, opens an account on it and returns
// the probe's arguments for paying from that account (the URL last).
func probeServe(t *testing.T, args ...string) []string {
	t.Helper()
	const apiKey, otherKey = "probe-api-key-s3cret", "other-api-key-s3cret"
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	srv := startServe(t, newApp(nil), append([]string{"--db", dbURL, "--api-keys", "acme:" + apiKey + ",globex:" + otherKey, "--log-level", "warn"}, args...)...)
	var acct accountBody
	if resp := srv.call(t, "POST", "/v1/accounts", apiKey, "", map[string]any{"balance": 1000000, "currency": "KRW"}, &acct); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/accounts: status %d", resp.StatusCode)
	}
	return []string{
		"probe",
		"--body", `{"account_id":"` + acct.ID + `","amount":{{n}},"currency":"KRW"}`,
		"--header", "Authorization: Bearer " + apiKey,
		"--count", srv.base + "/v1/accounts/" + acct.ID + "/payments?limit=1000",
		"--fault-header", "Idem-Fault: fail-before-commit",
		"--slow-header", "Idem-Fault: delay=1s",
		// Another tenant, and a short concurrent history: enough
		// overlapping duplicates for an unsafe server to show.
		"--as-other", "Authorization: Bearer " + otherKey,
		"--history", "60", "--history-keys", "10", "--history-dir", t.TempDir(),
		srv.base + "/v1/payments",
	}
}

type probeJSON struct {
	Checks []struct {
		Name   string
		Status string
		Reason string
	}
}

func TestProbeServePassesEveryCheck(t *testing.T) {
	t.Parallel()
	args := probeServe(t, "--faults")
	code, out, errOut := runCmd(t, args...)
	if code != exitOK {
		t.Fatalf("probe: exit %d, stderr %q; stdout:\n%s", code, errOut, out)
	}
	// Every line a pass but checks 10 and 11 (no --revoke, no --ttl):
	// checks 7, 8, 9 and 12 ran too.
	if n := strings.Count(out, "\n✓ "); n != 11 || !strings.Contains(out, "PASS: all 11 applicable checks passed") {
		t.Errorf("probe passed %d checks, want 11:\n%s", n, out)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("the report shows the API key:\n%s", out)
	}
}

func TestProbeServeUnsafeFailsTheRightChecks(t *testing.T) {
	t.Parallel()
	args := probeServe(t, "--faults", "--unsafe-no-idempotency")
	code, out, errOut := runCmd(t, append([]string{"probe", "--json"}, args[1:]...)...)
	if code != exitFailure {
		t.Fatalf("probe of an unsafe server: exit %d, stderr %q, want 1", code, errOut)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("the JSON report shows the API key")
	}
	var rep probeJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("decoding the JSON report: %v\n%s", err, out)
	}
	got := map[string][]string{}
	for _, c := range rep.Checks {
		got[c.Status] = append(got[c.Status], c.Name)
	}
	want := map[string][]string{
		"fail": {"concurrent-duplicates", "sequential-replay", "key-reuse-refused", "malformed-key-refused", "lost-response",
			"in-flight-duplicate", "history-linearizable"},
		// Keys are ignored, so none is required and nothing is replayed;
		// nothing is kept either, so a retry after a 5xx does run again,
		// and another tenant never gets the first one's answer.
		"n/a":  {"missing-key-refused", "no-credentials-replayed", "revoked-credential", "key-expiry"},
		"pass": {"5xx-not-kept", "scope-isolation"},
	}
	for status, names := range want {
		if !slices.Equal(got[status], names) {
			t.Errorf("%s: %v, want %v", status, got[status], names)
		}
	}
	if len(got["error"]) > 0 {
		t.Errorf("checks that could not run: %v\n%s", got["error"], out)
	}
}

// --draft adds the draft's core behaviours, which idem serve passes; with
// --strict, a duplicate in flight must get 409, which idem serve, waiting
// for the first answer instead (--inflight-wait is always positive), does
// not give: checks 8 and draft-concurrent-conflict fail, and nothing else.
func TestProbeServeDraftAndStrict(t *testing.T) {
	t.Parallel()
	args := probeServe(t, "--faults")
	for _, tc := range []struct {
		flags []string
		code  int
		fail  []string
	}{
		{[]string{"--draft"}, exitOK, nil},
		{[]string{"--draft", "--strict"}, exitFailure, []string{"in-flight-duplicate", "draft-concurrent-conflict"}},
	} {
		code, out, errOut := runCmd(t, append(append([]string{"probe", "--json"}, tc.flags...), args[1:]...)...)
		if code != tc.code {
			t.Errorf("%v: exit %d, stderr %q, want %d; stdout:\n%s", tc.flags, code, errOut, tc.code, out)
			continue
		}
		var rep probeJSON
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("decoding the JSON report: %v\n%s", err, out)
		}
		var fail, draft []string
		for _, c := range rep.Checks {
			if c.Status != "pass" && c.Status != "n/a" {
				fail = append(fail, c.Name)
			}
			if strings.HasPrefix(c.Name, "draft-") {
				draft = append(draft, c.Name+" "+c.Status)
			}
		}
		if !slices.Equal(fail, tc.fail) || len(draft) != 8 {
			t.Errorf("%v: not passing %v, want %v; the draft's checks: %v", tc.flags, fail, tc.fail, draft)
		}
	}
}

// idem serve forgets a key after --key-ttl, and a reused key then runs
// anew: check 11 says so. No --slow-header: a lease as short as the TTL
// would let check 8's duplicate take the key over. The TTL is every
// check's too: check 3 sends check 2's key again after check 1, so it must
// outlast what those take on a loaded machine (1s did not, at a load
// average of 28 on 2 cores).
func TestProbeServeKeyExpiry(t *testing.T) {
	t.Parallel()
	const ttl = "5s"
	args := probeServe(t, "--faults", "--key-ttl", ttl)
	var probeArgs []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--slow-header" {
			i++
			continue
		}
		probeArgs = append(probeArgs, args[i])
	}
	url := probeArgs[len(probeArgs)-1]
	probeArgs = append(probeArgs[:len(probeArgs)-1], "--json", "--ttl", ttl, url)
	code, out, errOut := runCmd(t, probeArgs...)
	if code != exitOK {
		t.Fatalf("probe: exit %d, stderr %q; stdout:\n%s", code, errOut, out)
	}
	var rep probeJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("decoding the JSON report: %v\n%s", err, out)
	}
	for _, c := range rep.Checks {
		if c.Name == "key-expiry" && (c.Status != "pass" || !strings.Contains(c.Reason, "ran anew")) {
			t.Errorf("key-expiry: %s %q, want a pass saying the key ran anew", c.Status, c.Reason)
		}
	}
}

func TestProbeUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"probe"}, "accepts 1 arg"},
		{[]string{"probe", "http://192.0.2.1/v1/payments"}, "--allow-remote"},
		{[]string{"probe", "--count", "http://192.0.2.1/n", "http://127.0.0.1:1/x"}, "--allow-remote"},
		{[]string{"probe", "--header", "no colon here", "http://127.0.0.1:1/x"}, "Name: value"},
		{[]string{"probe", "--body", "@" + filepath.Join(t.TempDir(), "missing.json"), "http://127.0.0.1:1/x"}, "missing.json"},
		{[]string{"probe", "--max-requests", "0", "http://127.0.0.1:1/x"}, "--max-requests"},
		{[]string{"probe", "--fault-header", "nope", "http://127.0.0.1:1/x"}, "fault header"},
		{[]string{"probe", "ftp://127.0.0.1/x"}, "http://"},
		{[]string{"probe", "--revoke", "POST http://127.0.0.1:1/revoke", "http://127.0.0.1:1/x"}, "go together"},
		{[]string{"probe", "--history", "-1", "http://127.0.0.1:1/x"}, "--history"},
	} {
		code, _, errOut := runCmd(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestProbeMaxRequests(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	var ids atomic.Int64
	// A server that runs everything: the probe would send some 40 requests.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]int64{"id": ids.Add(1)})
	}))
	t.Cleanup(srv.Close)
	code, out, _ := runCmd(t, "probe", "--max-requests", "7", "--body", `{"n":{{n}}}`, srv.URL)
	if code != exitFailure {
		t.Errorf("exit %d, want 1:\n%s", code, out)
	}
	if n := requests.Load(); n > 7 {
		t.Errorf("the server saw %d requests, more than --max-requests 7", n)
	}
	if !strings.Contains(out, "budget") {
		t.Errorf("the report does not say the budget ran out:\n%s", out)
	}
}

func TestProbeBodyFromFile(t *testing.T) {
	t.Parallel()
	var bodies atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 64)
		n, _ := r.Body.Read(b)
		bodies.CompareAndSwap(nil, string(b[:n])) // the first request's
		http.Error(w, "no", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "payment.json")
	if err := os.WriteFile(file, []byte(`{"amount":{{n}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(t.TempDir(), "probe.xml")
	code, out, errOut := runCmd(t, "probe", "--body", "@"+file, "--junit", junit, srv.URL)
	// The baseline is refused: the probe could not run, exit 2, with the
	// answers in the report.
	if code != exitUsage || !strings.Contains(out, "403") || !strings.Contains(out, "COULD NOT RUN") {
		t.Errorf("exit %d, stderr %q; want 2 and a report naming the 403:\n%s", code, errOut, out)
	}
	if x, err := os.ReadFile(junit); err != nil || !strings.Contains(string(x), "<error message=") || !strings.Contains(string(x), "<skipped") {
		t.Errorf("--junit wrote %q (%v), want an <error> and <skipped> cases", x, err)
	}
	if got, _ := bodies.Load().(string); got != `{"amount":1}` {
		t.Errorf("the server got body %q, want the file's with {{n}} = 1", got)
	}
}
