package idemprobe_test

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemprobe"
)

// Test against idemhttp: every check a subtest, each passing or skipped.
func TestTestRunsEachCheckAsASubtest(t *testing.T) {
	t.Parallel()
	cfg := paymentsConfig(newPaymentsAPI(t, false, nil))
	cfg.History = 40
	rep := idemprobe.Test(t, cfg)
	if !rep.OK() {
		t.Errorf("report not OK:\n%s", text(t, rep))
	}
}

// childEnv, set, makes TestChildProbe probe a fake with that flaw: the
// tests below run it in a child process of this test binary, since a
// subtest that fails would fail them.
const childEnv = "IDEMPROBE_TEST_CHILD"

// TestChildProbe is run by the tests below in a child process; it does
// nothing in the parent (it is not a test of its own, as os/exec's helper
// processes are not).
func TestChildProbe(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		return
	}
	f := map[string]flaw{"correct": correct, "mismatch-not-checked": noMismatchCheck, "baseline-refused": correct}[name]
	_, srv := newFakeAPI(t, f)
	cfg := fakeConfig(srv)
	if name == "baseline-refused" {
		cfg.Header = nil // the fake refuses requests without a credential
	}
	idemprobe.Test(t, cfg)
}

// runChild runs TestChildProbe against the fake named flaw, with -run
// pattern run, and returns its verbose output and whether it passed.
func runChild(t *testing.T, flaw, run string) (string, bool) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", run, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+flaw)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running the child: %v\n%s", err, out)
	}
	return string(out), err == nil
}

// A flaw fails its check's subtest, with the report's words and evidence;
// the other subtests pass or are skipped with their reasons.
func TestTestFailsTheSubtestOfAFlaw(t *testing.T) {
	t.Parallel()
	out, ok := runChild(t, "mismatch-not-checked", "^TestChildProbe$")
	if ok {
		t.Fatalf("the child passed:\n%s", out)
	}
	for _, want := range []string{
		"--- FAIL: TestChildProbe/key-reuse-refused",
		"answered 201 Created with the first request's answer: the body was not compared",
		"source: draft-ietf-httpapi-idempotency-key-header-07 §2.2 Uniqueness of Idempotency Key",
		"    → POST http://127.0.0.1:",
		"--- PASS: TestChildProbe/sequential-replay",
		"--- PASS: TestChildProbe/malformed-key-refused",
		"--- SKIP: TestChildProbe/scope-isolation",
		"not applicable: no --as-other given",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
	// The subtests run in the order the checks run: the baseline first,
	// the history last.
	runs := regexp.MustCompile(`=== RUN   TestChildProbe/(\S+)`).FindAllStringSubmatch(out, -1)
	if len(runs) != 13 || runs[0][1] != "sequential-replay" || runs[12][1] != "history-linearizable" {
		t.Errorf("subtests run: %v, want the 13 checks from sequential-replay to history-linearizable", runs)
	}
	if n := strings.Count(out, "--- FAIL: TestChildProbe/"); n != 1 {
		t.Errorf("%d subtests failed, want 1:\n%s", n, out)
	}
}

// go test -run selects checks by name; the baseline runs anyway, without
// its subtest, since every check needs its first request.
func TestTestRunSelectsChecks(t *testing.T) {
	t.Parallel()
	out, ok := runChild(t, "mismatch-not-checked", "^TestChildProbe$/^key-reuse-refused$")
	if ok {
		t.Fatalf("the child passed:\n%s", out)
	}
	runs := regexp.MustCompile(`=== RUN   TestChildProbe/(\S+)`).FindAllStringSubmatch(out, -1)
	if len(runs) != 1 || runs[0][1] != "key-reuse-refused" || !strings.Contains(out, "the body was not compared") {
		t.Errorf("subtests run: %v, want key-reuse-refused alone, failing:\n%s", runs, out)
	}
	out, ok = runChild(t, "correct", "^TestChildProbe$/^malformed-key-refused$")
	if !ok || !strings.Contains(out, "--- PASS: TestChildProbe/malformed-key-refused") {
		t.Errorf("a passing check selected alone: passed %v:\n%s", ok, out)
	}
}

// An endpoint that accepts none of the probe's requests fails the
// baseline's subtest, saying why, and skips the others as not run.
func TestTestBaselineRefused(t *testing.T) {
	t.Parallel()
	out, ok := runChild(t, "baseline-refused", "^TestChildProbe$")
	if ok {
		t.Fatalf("the child passed:\n%s", out)
	}
	for _, want := range []string{
		"--- FAIL: TestChildProbe/sequential-replay",
		"could not finish: could not run: POST http://127.0.0.1:",
		"401 Unauthorized",
		"--- SKIP: TestChildProbe/concurrent-duplicates",
		"not run: the endpoint accepted none of the probe's requests",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
}
