package main

import (
	"os"
	"strings"
	"testing"
)

// testdata/events.json is what `go test -json` printed for four packages: a
// passing one, one with a failing parallel subtest beside a passing test that
// logs and a skipped one, one whose test outlived -timeout, and one that did
// not build.
func TestReport(t *testing.T) {
	f, err := os.Open("testdata/events.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	r := newReport(&b)
	if err := r.read(f); err != nil {
		t.Fatal(err)
	}
	r.summary(15)
	out := b.String()
	t.Log("\n" + out)

	for _, want := range []string{
		"ok  \ttr/b\t",                // a passing package's line
		"a_test.go:4: sub broke",      // a failing subtest's output
		"a_test.go:4: before",         // its parent's own output
		"--- FAIL: TestFail (",        // and its verdict
		"FAIL\ttr/a\t",                // the failing package's line
		"c_test.go:3: hanging",        // what a test that never ended printed
		"panic: test timed out after", // why its binary stopped
		"d_test.go:3:31: undefined",   // a build error
		"FAIL\ttr/d [build failed]",   // and its package's line
		"== slowest 4 tests\n     30ms  tr/a.TestPass\n",
		"== wall time per package (4 packages, 2s in all, 1 tests skipped)\n    2.01s  tr/c  FAIL\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, unwanted := range []string{
		"quiet",             // a passing test's log, which plain go test hides too
		"tr/a.TestFail/sub", // subtests count in their parent's time
	} {
		if strings.Contains(out, unwanted) {
			t.Errorf("the report shows %q", unwanted)
		}
	}
}
