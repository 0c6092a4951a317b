package main

import (
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func write(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A line of scripts/mutation.packages names its test packages; each may
// carry its own -run pattern after =, the others take the line's, and the
// packages that share a pattern run in one go test command.
func TestReadConfigGroupsTestPackagesByRunPattern(t *testing.T) {
	p := write(t, "packages", `# a comment

keyed | 95 | 90 | ./keyed ./idemtest=^TestMemory(Middleware|FaceHTTP)$ ./idemsqlite=^TestFace$ ./idemmem |  |
root  | 95 | 90.5 | . | ^TestA|^TestB |
`)
	confs, err := readConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(confs) != 2 {
		t.Fatalf("got %d lines, want 2", len(confs))
	}
	k := confs[0]
	if k.dir != "keyed" || k.efficacy != 95 || k.mcover != 90 || k.files != nil {
		t.Errorf("keyed's line read as %+v", k)
	}
	want := []testRun{
		{pkgs: []string{"./keyed", "./idemmem"}},
		{pkgs: []string{"./idemtest"}, run: "^TestMemory(Middleware|FaceHTTP)$"},
		{pkgs: []string{"./idemsqlite"}, run: "^TestFace$"},
	}
	if !reflect.DeepEqual(k.tests, want) {
		t.Errorf("keyed's tests = %+v, want %+v", k.tests, want)
	}
	if got := k.tests[1].args(); !reflect.DeepEqual(got, []string{"-run", "^TestMemory(Middleware|FaceHTTP)$", "./idemtest"}) {
		t.Errorf("go test arguments of idemtest's run = %q", got)
	}
	if got := k.tests[0].args(); !reflect.DeepEqual(got, []string{"./keyed", "./idemmem"}) {
		t.Errorf("go test arguments of a run of all tests = %q", got)
	}
	r := confs[1]
	if r.mcover != 90.5 || !reflect.DeepEqual(r.tests, []testRun{{pkgs: []string{"."}, run: "^TestA|^TestB"}}) {
		t.Errorf("the line's -run pattern is not its packages' default: %+v", r)
	}
}

func TestReadConfigFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "store.go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	confs, err := readConfig(write(t, "packages", dir+" | 90 | 90 | ./x |  | store.go\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(confs[0].files, map[string]bool{"store.go": true}) {
		t.Errorf("files = %v", confs[0].files)
	}
	if _, err := readConfig(write(t, "packages", dir+" | 90 | 90 | ./x |  | store.go gone.go\n")); err == nil || !strings.Contains(err.Error(), "gone.go") {
		t.Errorf("a file the package lacks: err = %v, want one naming gone.go", err)
	}
}

// A line that cannot be read is refused with its line number, never read
// as something else.
func TestReadConfigRefusesBadLines(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"keyed | 95 | 90 | ./keyed", "want 6 fields"},
		{"keyed | 95 | 90 | ./keyed |  |  | extra", "want 6 fields"},
		{"keyed | x | 90 | ./keyed |  |", "efficacy floor"},
		{"keyed | 95 | 9o | ./keyed |  |", "coverage floor"},
		{"keyed | 95 | 90 |  |  |", "no test packages"},
		{"keyed | 95 | 90 | ./keyed ./idemtest= |  |", "empty -run pattern"},
		{"keyed | 95 | 90 | =^TestX$ |  |", "no test package"},
		{"keyed | 95 | 90 | ./idemtest=^Test( |  |", "-run pattern"},
		{"keyed | 95 | 90 | ./idemtest |  ^Test( |", "-run pattern"},
	} {
		_, err := readConfig(write(t, "packages", "# header\n"+tc.line+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ":2:") {
			t.Errorf("%q: err = %v, want one at line 2 saying %q", tc.line, err, tc.want)
		}
	}
}

func TestReadEquivalents(t *testing.T) {
	p := write(t, "equivalents", `# header
keyed/a.go | f | CONDITIONALS_BOUNDARY | if n > 0 { | n is never negative
keyed/a.go | T.g | INVERT_BITWISE@2 | x := a | b | c | a bitwise or stays in the source line
`)
	es, err := readEquivalents(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("got %d lines, want 2", len(es))
	}
	if e := es[0]; e.no != 2 || e.path != "keyed/a.go" || e.fn != "f" || e.typ != "CONDITIONALS_BOUNDARY" || e.nth != 0 || e.src != "if n > 0 {" || e.reason != "n is never negative" {
		t.Errorf("line 2 read as %+v", e)
	}
	// The first three fields split from the left, the reason from the
	// right: the source line keeps its own " | ".
	if e := es[1]; e.fn != "T.g" || e.typ != "INVERT_BITWISE" || e.nth != 2 || e.src != "x := a | b | c" || e.reason != "a bitwise or stays in the source line" {
		t.Errorf("line 3 read as %+v", e)
	}
	for _, tc := range []struct{ line, want string }{
		{"keyed/a.go | f | CONDITIONALS_BOUNDARY | if n > 0 {", "want path"},
		{"keyed/a.go | f | NO_SUCH | if n > 0 { | r", "unknown mutator"},
		{"keyed/a.go | f | CONDITIONALS_BOUNDARY@0 | if n > 0 { | r", "counts from 1"},
		{"keyed/a.go | f | CONDITIONALS_BOUNDARY@x | if n > 0 { | r", "counts from 1"},
		{"keyed/a.go |  | CONDITIONALS_BOUNDARY | if n > 0 { | r", "an empty field"},
	} {
		if _, err := readEquivalents(write(t, "equivalents", tc.line+"\n")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one saying %q", tc.line, err, tc.want)
		}
	}
}

// A line of the equivalents file marks the mutants its key names, the Nth
// of a type on a line when it says @N; a line of the measured package that
// names no mutant is stale (the code changed under it), and lines of other
// packages are not judged.
func TestMarkEquivalentsAndStaleLines(t *testing.T) {
	m := func(typ string, nth, of int, src string) *mutant {
		return &mutant{file: "keyed/a.go", fn: "f", typ: typ, nth: nth, of: of, src: src}
	}
	first := m("CONDITIONALS_BOUNDARY", 1, 2, "if a < b && c < d {")
	second := m("CONDITIONALS_BOUNDARY", 2, 2, "if a < b && c < d {")
	neg := m("CONDITIONALS_NEGATION", 1, 1, "if n > 0 {")
	other := m("CONDITIONALS_BOUNDARY", 1, 1, "if n > 0 {")
	muts := []*mutant{first, second, neg, other}
	eq := func(fn, typ string, nth int, src string) *equivalent {
		return &equivalent{path: "keyed/a.go", fn: fn, typ: typ, nth: nth, src: src, reason: "r"}
	}
	nth2 := eq("f", "CONDITIONALS_BOUNDARY", 2, "if a < b && c < d {")
	all := eq("f", "CONDITIONALS_NEGATION", 0, "if n > 0 {")
	movedFn := eq("g", "CONDITIONALS_BOUNDARY", 0, "if n > 0 {")
	changed := eq("f", "CONDITIONALS_BOUNDARY", 0, "if n >= 0 {")
	noThird := eq("f", "CONDITIONALS_BOUNDARY", 3, "if a < b && c < d {")
	elsewhere := &equivalent{path: "idemhttp/b.go", fn: "f", typ: "CONDITIONALS_BOUNDARY", src: "if n > 0 {", reason: "r"}
	stale := markEquivalents(pkgConf{dir: "keyed"}, muts, []*equivalent{nth2, all, movedFn, changed, noThird, elsewhere})

	if !reflect.DeepEqual(stale, []*equivalent{movedFn, changed, noThird}) {
		t.Errorf("stale = %v, want the lines whose function, source or rank names no mutant", stale)
	}
	if first.equiv != nil || second.equiv != nth2 {
		t.Errorf("@2 marked the first mutant (%v) or not the second (%v)", first.equiv, second.equiv)
	}
	if neg.equiv != all || other.equiv != nil {
		t.Errorf("a line marks only its mutator's mutants: negation %v, boundary %v", neg.equiv, other.equiv)
	}
	if elsewhere.matched {
		t.Error("a line of another package was judged")
	}

	// A line of a file the package's line does not mutate is not judged.
	otherFile := &equivalent{path: "keyed/b.go", fn: "f", typ: "CONDITIONALS_BOUNDARY", src: "if n > 0 {", reason: "r"}
	if stale := markEquivalents(pkgConf{dir: "keyed", files: map[string]bool{"a.go": true}}, muts, []*equivalent{otherFile}); len(stale) != 0 {
		t.Errorf("a line of a file left out of the measure was judged stale: %v", stale)
	}
	if stale := markEquivalents(pkgConf{dir: "keyed"}, muts, []*equivalent{otherFile}); len(stale) != 1 {
		t.Errorf("a line of a measured file that names no mutant: stale %v, want it", stale)
	}
}

// The key a lived mutant is printed with is the one the equivalents file
// takes: MUTATOR@N only when its line holds more than one of that type.
func TestMutantKey(t *testing.T) {
	m := &mutant{file: "keyed/a.go", fn: "T.f", typ: "CONDITIONALS_BOUNDARY", nth: 2, of: 2, src: "if a < b && c < d {"}
	if got, want := m.key(), "keyed/a.go | T.f | CONDITIONALS_BOUNDARY@2 | if a < b && c < d {"; got != want {
		t.Errorf("key = %q, want %q", got, want)
	}
	m.nth, m.of = 1, 1
	if got, want := m.key(), "keyed/a.go | T.f | CONDITIONALS_BOUNDARY | if a < b && c < d {"; got != want {
		t.Errorf("key = %q, want %q", got, want)
	}
}

// Efficacy is killed ÷ (killed + lived); mutator coverage is reached ÷
// (reached + not covered), reached being killed, lived or timed out;
// equivalent and not viable mutants count in neither.
func TestFigures(t *testing.T) {
	for _, tc := range []struct {
		count    map[string]int
		eff, cov float64
	}{
		{map[string]int{"KILLED": 19, "LIVED": 1}, 95, 100},
		{map[string]int{"KILLED": 6, "LIVED": 2, "TIMED OUT": 2, "NOT COVERED": 10}, 75, 50},
		{map[string]int{"KILLED": 3, "EQUIVALENT": 40, "NOT VIABLE": 40, "NOT COVERED": 1}, 100, 75},
		{map[string]int{"TIMED OUT": 1, "NOT COVERED": 3}, 100, 25},
		{map[string]int{}, 100, 100},
		{map[string]int{"EQUIVALENT": 5}, 100, 100},
		{map[string]int{"LIVED": 4}, 0, 100},
	} {
		eff, cov := figures(tc.count)
		if eff != tc.eff || cov != tc.cov {
			t.Errorf("%v: efficacy %v, coverage %v; want %v, %v", tc.count, eff, cov, tc.eff, tc.cov)
		}
	}
}

// A package fails below either floor (the floor itself passes), and with a
// stale equivalent whatever its figures; a run the budget cut short is not
// judged.
func TestJudge(t *testing.T) {
	c := pkgConf{dir: "keyed", efficacy: 95, mcover: 90}
	for _, tc := range []struct {
		eff, cov       float64
		stale, skipped int
		want           string
		failed         bool
	}{
		{95, 90, 0, 0, "ok", false},
		{100, 100, 0, 0, "ok", false},
		{94.99, 100, 0, 0, "FAIL: below the floors", true},
		{100, 89.9, 0, 0, "FAIL: below the floors", true},
		{100, 100, 1, 0, "FAIL: 1 stale", true},
		{10, 10, 0, 3, "NOT JUDGED", false},
		{100, 100, 2, 3, "FAIL: 2 stale", true},
	} {
		v, failed := judge(c, tc.eff, tc.cov, tc.stale, tc.skipped)
		if !strings.HasPrefix(v, tc.want) || failed != tc.failed {
			t.Errorf("efficacy %v, coverage %v, %d stale, %d skipped: %q (failed %v), want %q (failed %v)",
				tc.eff, tc.cov, tc.stale, tc.skipped, v, failed, tc.want, tc.failed)
		}
	}
}

// A mutant is reached when a covered block holds its position, or, in a
// case expression (which no block holds), when its switch is, or, in no
// block (after a function literal), when its statement is, or, in a
// package-level declaration, when any of the package ran; the blocks of
// several profiles add up.
func TestCoverBlocks(t *testing.T) {
	dir := t.TempDir()
	a := write(t, "a.out", "mode: set\nexample.com/p/a.go:10.2,12.3 2 1\nexample.com/p/a.go:20.1,21.5 1 0\nexample.com/q/a.go:30.1,31.1 1 1\n")
	b := write(t, "b.out", "mode: set\nexample.com/p/a.go:20.1,21.5 1 0\nexample.com/p/b.go:5.1,6.1 1 3\n")
	cb := coverBlocks{}
	for _, p := range []string{a, b} {
		if err := cb.read(p, "example.com/p", dir); err != nil {
			t.Fatal(err)
		}
	}
	fa, fb := filepath.Join(dir, "a.go"), filepath.Join(dir, "b.go")
	for _, tc := range []struct {
		m    *mutant
		want bool
	}{
		{&mutant{file: fa, line: 11, col: 40}, true},
		{&mutant{file: fa, line: 10, col: 2}, true},
		{&mutant{file: fa, line: 10, col: 1}, false},
		{&mutant{file: fa, line: 12, col: 3}, false}, // the end column is past the block
		{&mutant{file: fa, line: 20, col: 4}, false}, // a block no test ran
		{&mutant{file: fa, line: 30, col: 4}, false}, // another package's block
		{&mutant{file: fb, line: 5, col: 9}, true},   // from the second profile
		{&mutant{file: fa, line: 25, col: 7, inCase: &token.Position{Line: 11, Column: 2}}, true},
		{&mutant{file: fa, line: 25, col: 7, inCase: &token.Position{Line: 20, Column: 2}}, false},
		{&mutant{file: fa, line: 3, col: 20, fn: "-"}, true},                                              // a package-level constant: loaded with the package
		{&mutant{file: fa, line: 15, col: 9, fn: "f", stmt: &token.Position{Line: 11, Column: 2}}, true},  // after a function literal: its statement ran
		{&mutant{file: fa, line: 15, col: 9, fn: "f", stmt: &token.Position{Line: 20, Column: 2}}, false}, // its statement did not
		{&mutant{file: fa, line: 11, col: 9, fn: "f", stmt: &token.Position{Line: 20, Column: 2}}, true},  // a block that ran holds it
		{&mutant{file: fa, line: 20, col: 4, fn: "-"}, false},                                             // a package-level function literal's block no test ran
	} {
		if got := cb.covers(tc.m); got != tc.want {
			t.Errorf("%s (in case %v): covered %v, want %v", tc.m.pos(), tc.m.inCase, got, tc.want)
		}
	}
	if (coverBlocks{fa: {{[2]int{1, 1}, [2]int{2, 1}, false}}}).covers(&mutant{file: fa, line: 5, col: 1, fn: "-"}) {
		t.Error("a package-level constant of a package no test ran counted as reached")
	}
	if err := cb.read(write(t, "bad.out", "mode: set\nexample.com/p/a.go:x 1 1\n"), "example.com/p", dir); err == nil {
		t.Error("a profile line that cannot be read was taken")
	}
}

// apply makes gremlins' replacement at the mutant's offset and nowhere else.
func TestApply(t *testing.T) {
	src := []byte("package p\n\nfunc f(a, b int) bool { return a < b && a-1 < b }\n")
	off := strings.Index(string(src), "< b &&")
	got, err := apply(src, &mutant{file: "p.go", typ: "CONDITIONALS_BOUNDARY", offset: off})
	if err != nil {
		t.Fatal(err)
	}
	if want := "package p\n\nfunc f(a, b int) bool { return a <= b && a-1 < b }\n"; string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := apply(src, &mutant{file: "p.go", typ: "INCREMENT_DECREMENT", offset: off}); err == nil {
		t.Error("a mutator applied to a token it does not replace")
	}
}

// describe names a mutant by its function and source line, and finds the
// statement that holds it, which a cover block may leave out when a
// function literal splits it.
func TestDescribe(t *testing.T) {
	p := write(t, "a.go", `package p

import "strings"

const n = 2 * 3

func (s *T) ok(id string) bool {
	if strings.IndexFunc(id, func(r rune) bool { return r > 0x7e }) >= 0 {
		return false
	}
	return true
}
`)
	fi, err := parseFile(p)
	if err != nil {
		t.Fatal(err)
	}
	after := &mutant{file: p, line: 8, col: strings.Index("\tif strings.IndexFunc(id, func(r rune) bool { return r > 0x7e }) >= 0 {", ">=") + 1}
	if err := fi.describe(after); err != nil {
		t.Fatal(err)
	}
	if after.fn != "T.ok" || after.src != "if strings.IndexFunc(id, func(r rune) bool { return r > 0x7e }) >= 0 {" {
		t.Errorf("described as %q, %q", after.fn, after.src)
	}
	if after.stmt == nil || after.stmt.Line != 8 || after.stmt.Column != 2 {
		t.Errorf("statement = %v, want the if at 8:2", after.stmt)
	}
	inLit := &mutant{file: p, line: 8, col: strings.Index("\tif strings.IndexFunc(id, func(r rune) bool { return r > 0x7e }) >= 0 {", "> 0x7e") + 1}
	if err := fi.describe(inLit); err != nil {
		t.Fatal(err)
	}
	if inLit.stmt == nil || inLit.stmt.Line != 8 || inLit.stmt.Column <= 40 {
		t.Errorf("statement = %v, want the literal's return", inLit.stmt)
	}
	konst := &mutant{file: p, line: 5, col: 13}
	if err := fi.describe(konst); err != nil {
		t.Fatal(err)
	}
	if konst.fn != "-" || konst.stmt != nil {
		t.Errorf("a package-level constant described as in %q, statement %v", konst.fn, konst.stmt)
	}
	if err := fi.describe(&mutant{file: p, line: 99, col: 1}); err == nil {
		t.Error("a line the file does not have was described")
	}
}

// changedLines reads the new file's line numbers from the hunk headers of
// git diff -U0: "+c,d" is d lines from c, "+c" one line, "+c,0" none (the
// hunk only takes lines out).
func TestChangedLines(t *testing.T) {
	diff := `diff --git a/docs/mutation-equivalents.txt b/docs/mutation-equivalents.txt
index 1111111..2222222 100644
--- a/docs/mutation-equivalents.txt
+++ b/docs/mutation-equivalents.txt
@@ -40 +40 @@ consumer/batch.go | runner.gather
-old
+new
@@ -50,0 +51,2 @@
+one
+two
@@ -60,3 +62,0 @@
-gone
@@ -70,0 +70 @@
+@@ not a header
`
	got := changedLines(diff)
	want := map[int]bool{40: true, 51: true, 52: true, 70: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("changedLines = %v, want %v", got, want)
	}
}

// A change that touches only docs/mutation-equivalents.txt, or a package's
// line of scripts/mutation.packages, still has the packages it names
// judged, so that a stale equivalent fails the change that made it; a test
// file or a line taken out touches nothing.
func TestTouchedPackages(t *testing.T) {
	equivs := []*equivalent{
		{no: 40, path: "consumer/batch.go"},
		{no: 41, path: "idemsqlite/inbox.go"},
		{no: 42, path: "outbox/outbox.go"},
	}
	confs := []pkgConf{{no: 20, dir: "deadletter"}, {no: 21, dir: "idempg"}}
	got := touchedPackages([]string{"keyed/heartbeat.go", "outbox/outbox_test.go", "docs/testing.md"},
		map[int]bool{41: true}, equivs, map[int]bool{21: true}, confs)
	want := map[string]bool{"keyed": true, "idemsqlite": true, "idempg": true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("touchedPackages = %v, want %v", got, want)
	}
}

// A -since run measures the mutants on the lines changed since its commit,
// in a package anywhere in the repository: gremlins' own diff matched its
// files' names with git's paths from the root, so in every package but the
// root one it found no line changed and the run measured nothing.
func TestMarkOutsideDiffInASubdirectory(t *testing.T) {
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	dir := filepath.Join(repo, "pkg", "sub")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "x.go")
	if err := os.WriteFile(file, []byte("package sub\n\nfunc f(a int) bool { return a > 1 }\n\nfunc g(a int) bool { return a < 2 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", ".")
	git("commit", "-q", "-m", "base")
	if err := os.WriteFile(file, []byte("package sub\n\nfunc f(a int) bool { return a >= 1 }\n\nfunc g(a int) bool { return a < 2 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("commit", "-q", "-am", "change")
	ms := []*mutant{{file: file, line: 3}, {file: file, line: 5}}
	if err := markOutsideDiff(ms, "HEAD^"); err != nil {
		t.Fatal(err)
	}
	if ms[0].outside || !ms[1].outside {
		t.Errorf("outside the diff: line 3 %v, line 5 %v; want false (changed), true (unchanged)", ms[0].outside, ms[1].outside)
	}
	if err := markOutsideDiff(ms, "no-such-commit"); err == nil {
		t.Error("a diff against a commit that does not exist: no error")
	}
}

// selectionFixture is a line's two test packages: p1's tests A, B and C,
// each with what it reached run alone, and p2's D, which reached nothing
// of what A reached; their baselines are 10 s of overhead (building and
// linking) and test binaries of 6 and 4 s, the tests taking 1, 2, 3 and 4
// s run alone.
func selectionFixture(t *testing.T) (pkgs []*testPkg, file string) {
	dir := t.TempDir()
	file = filepath.Join(dir, "a.go")
	blocks := func(hit ...[2]int) coverBlocks {
		cb := coverBlocks{file: {}}
		for _, l := range [][2]int{{10, 20}, {30, 40}, {50, 60}} {
			b := coverBlock{[2]int{l[0], 1}, [2]int{l[1], 1}, false}
			for _, h := range hit {
				b.hit = b.hit || h == l
			}
			cb[file] = append(cb[file], b)
		}
		return cb
	}
	s := time.Second
	p1 := &testPkg{path: "example.com/p", run: "^Test", tests: []string{"TestA", "TestB", "TestC"},
		cover: map[string]coverBlocks{"TestA": blocks([2]int{10, 20}), "TestB": blocks([2]int{10, 20}, [2]int{30, 40}), "TestC": blocks()},
		wall:  16 * s, binary: 6 * s,
		alone: map[string]time.Duration{"TestA": 1 * s, "TestB": 2 * s, "TestC": 3 * s}}
	p2 := &testPkg{path: "example.com/q", tests: []string{"TestD"},
		cover: map[string]coverBlocks{"TestD": blocks([2]int{30, 40})},
		wall:  14 * s, binary: 4 * s,
		alone: map[string]time.Duration{"TestD": 4 * s}}
	return []*testPkg{p1, p2}, file
}

// Each mutant runs only the top-level tests that reached its line when
// each test ran alone, per test package in the line's order; a test
// package none of whose tests reached it is left out. A mutant the whole
// selection reached but no test alone (coverage that varies from run to
// run), or one in a package-level declaration (read, perhaps, without
// running a block of the package), runs every selected test.
func TestPickTests(t *testing.T) {
	pkgs, file := selectionFixture(t)
	p1, p2 := pkgs[0], pkgs[1]
	for _, tc := range []struct {
		name string
		m    *mutant
		want []pick
	}{
		{"one test of one package", &mutant{file: file, line: 15, col: 3, fn: "f"}, []pick{{p1, []string{"TestA", "TestB"}}}},
		{"tests of both packages", &mutant{file: file, line: 35, col: 3, fn: "f"}, []pick{{p1, []string{"TestB"}}, {p2, []string{"TestD"}}}},
		{"in a case expression: its switch's tests", &mutant{file: file, line: 70, col: 3, fn: "f", inCase: &token.Position{Line: 32, Column: 2}}, []pick{{p1, []string{"TestB"}}, {p2, []string{"TestD"}}}},
		{"reached by no test alone", &mutant{file: file, line: 55, col: 3, fn: "f"}, []pick{{p1, nil}, {p2, nil}}},
		{"package-level", &mutant{file: file, line: 15, col: 3, fn: "-"}, []pick{{p1, nil}, {p2, nil}}},
	} {
		if got := pickTests(tc.m, pkgs); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: picked %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A package whose -run pattern names subtests (a /) cannot be split into
// its top-level tests: it runs as a whole when its selection, run alone,
// reached the mutant.
func TestPickTestsOfAPackageRunWhole(t *testing.T) {
	pkgs, file := selectionFixture(t)
	w := &testPkg{path: "example.com/w", run: "^TestSuite$/^Case$", whole: true,
		cover: map[string]coverBlocks{"": pkgs[1].cover["TestD"]}, wall: time.Second}
	pkgs = append(pkgs, w)
	got := pickTests(&mutant{file: file, line: 35, col: 3, fn: "f"}, pkgs)
	want := []pick{{pkgs[0], []string{"TestB"}}, {pkgs[1], []string{"TestD"}}, {w, nil}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("picked %v, want %v", got, want)
	}
	if got := (pick{w, nil}).args(); !reflect.DeepEqual(got, []string{"-run", "^TestSuite$/^Case$", "example.com/w"}) {
		t.Errorf("args of a package run whole = %q", got)
	}
	if !runsSubtests("^TestA$/x") || runsSubtests("^Test(A|B)$") {
		t.Error("runsSubtests does not tell a pattern naming subtests")
	}
}

// The tests picked run as one go test command per test package, their
// names anchored; a package's whole selection keeps its line's pattern.
func TestPickArgs(t *testing.T) {
	pkgs, _ := selectionFixture(t)
	for _, tc := range []struct {
		p    pick
		want []string
	}{
		{pick{pkgs[0], []string{"TestA", "TestB"}}, []string{"-run", "^(TestA|TestB)$", "example.com/p"}},
		{pick{pkgs[0], nil}, []string{"-run", "^Test", "example.com/p"}},
		{pick{pkgs[1], nil}, []string{"example.com/q"}},
		{pick{pkgs[1], []string{"Example_x.y"}}, []string{"-run", `^(Example_x\.y)$`, "example.com/q"}},
	} {
		if got := tc.p.args(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v: args %q, want %q", tc.p, got, tc.want)
		}
	}
}

// A mutant's cut is -timeout-factor times the baseline of the tests it
// runs: for each package, the baseline's wall time less its test binary's
// run (the build), plus the time its tests took run alone (never more than
// the binary's run, which parallel tests could otherwise pass), at least
// -min-timeout. The tests' times in the baseline's own run are no measure:
// parallel tests there share the machine, and each takes about as long as
// the whole.
func TestCutOfTheTestsPicked(t *testing.T) {
	pkgs, _ := selectionFixture(t)
	p1, p2 := pkgs[0], pkgs[1]
	s := time.Second
	for _, tc := range []struct {
		picks []pick
		want  time.Duration
	}{
		{[]pick{{p1, []string{"TestA"}}}, 4 * 11 * s},                                          // 10 s overhead + 1 s
		{[]pick{{p1, []string{"TestA", "TestC"}}, {p2, []string{"TestD"}}}, 4 * (14 + 14) * s}, // (10+1+3) + (10+4)
		{[]pick{{p1, nil}, {p2, nil}}, 4 * 30 * s},                                             // every test: the whole baseline
		{[]pick{{&testPkg{wall: 5 * s, binary: 4 * s, alone: map[string]time.Duration{"TestA": 4 * s, "TestB": 4 * s}}, []string{"TestA", "TestB"}}}, 20 * s}, // parallel tests
		{[]pick{{&testPkg{wall: 100 * s, binary: 90 * s, alone: map[string]time.Duration{"TestA": 5 * s, "TestB": 80 * s}}, []string{"TestA"}}}, 60 * s},      // a short test of a long selection
	} {
		if got := cutFor(tc.picks, 4, 0); got != tc.want {
			t.Errorf("%v: cut %s, want %s", tc.picks, got, tc.want)
		}
	}
	if got := cutFor([]pick{{p1, []string{"TestA"}}}, 4, 90*s); got != 90*s {
		t.Errorf("cut below the floor: %s, want 90s", got)
	}
}

// A test binary's -test.list names the tests, examples, fuzz targets and
// benchmarks its pattern selects; benchmarks do not run under -run, and
// what else it prints is no test.
func TestParseTestList(t *testing.T) {
	out := "TestA\nExampleB\nFuzzC\nBenchmarkD\nwarning: GOCOVERDIR not set, no coverage data emitted\nok  \tx\n\n"
	if got, want := parseTestList(out), []string{"TestA", "ExampleB", "FuzzC"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The baseline's go test -json gives each top-level test's own time and,
// under "", the test binary's; subtests are not tests of their own.
func TestParseTestTimes(t *testing.T) {
	out := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA/sub","Elapsed":0.5}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":1.25}
{"Action":"skip","Package":"p","Test":"TestB","Elapsed":0}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"pass","Package":"p","Elapsed":3}
go: downloading something
`
	want := map[string]time.Duration{"TestA": 1250 * time.Millisecond, "TestB": 0, "": 3 * time.Second}
	if got := parseTestTimes([]byte(out)); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// The budget is checked when a worker is free to start a mutant, not
// before waiting for one: the hand-out checked it, then waited for a
// worker, and gave the next mutant to the first one free however long
// that took, so a run could start up to two cuts past the budget. With
// one worker, each mutant is admitted by a look at the clock taken after
// the run before it ended.
func TestHandOutStartsNoMutantPastTheBudget(t *testing.T) {
	var mu sync.Mutex
	var events []string
	clock := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, "check")
		return clock
	}
	deadline := clock.Add(time.Minute)
	started, release := make(chan int, 5), make(chan struct{})
	done := make(chan int)
	go func() {
		done <- handOut(5, 1, deadline, now, func(i int) {
			mu.Lock()
			events = append(events, "start "+strconv.Itoa(i))
			mu.Unlock()
			started <- i
			<-release
			mu.Lock()
			events = append(events, "end "+strconv.Itoa(i))
			mu.Unlock()
		})
	}()
	if i := <-started; i != 0 {
		t.Fatalf("mutant %d started first", i)
	}
	// Let the hand-out look at the clock while the run goes on, if it
	// would: it must not (a yield, not a wait: nothing is owed).
	for i := 0; i < 1000; i++ {
		runtime.Gosched()
	}
	// The first run outlasts the budget.
	mu.Lock()
	clock = clock.Add(2 * time.Minute)
	mu.Unlock()
	close(release)
	skipped := <-done
	if want := []string{"check", "start 0", "end 0", "check"}; !reflect.DeepEqual(events, want) || skipped != 4 {
		t.Errorf("events %q, %d left unstarted; want %q, 4 left unstarted", events, skipped, want)
	}
	var n atomic.Int32
	if skipped := handOut(3, 2, time.Time{}, time.Now, func(int) { n.Add(1) }); skipped != 0 || n.Load() != 3 {
		t.Errorf("no budget: %d run, %d left unstarted", n.Load(), skipped)
	}
}

// A test package one of whose tests fails run alone (it leans on another
// test having run first) cannot be split: its selection runs whole for
// every mutant, as with -all-tests.
func TestPickTestsOfAPackageWhoseTestFailsAlone(t *testing.T) {
	pkgs, file := selectionFixture(t)
	pkgs[1].always = true
	got := pickTests(&mutant{file: file, line: 15, col: 3, fn: "f"}, pkgs)
	if want := []pick{{pkgs[0], []string{"TestA", "TestB"}}, {pkgs[1], nil}}; !reflect.DeepEqual(got, want) {
		t.Errorf("picked %v, want %v", got, want)
	}
}

// A mutant that no test reached run alone runs every selected test, even
// beside a test package run whole because one of its tests fails alone:
// that package alone is no sign that a test reaching the line runs.
func TestPickTestsReachedByNoTestAloneBesideAPackageRunWhole(t *testing.T) {
	pkgs, file := selectionFixture(t)
	pkgs[1].always = true
	got := pickTests(&mutant{file: file, line: 55, col: 3, fn: "f"}, pkgs)
	if want := []pick{{pkgs[0], nil}, {pkgs[1], nil}}; !reflect.DeepEqual(got, want) {
		t.Errorf("picked %v, want %v", got, want)
	}
}

// A test run alone in the coverage of each test is cut, as go test cuts a
// test binary (its -timeout): one that hangs alone, waiting for what a
// test before it would have done, counts as failing alone (its package
// runs whole for every mutant) rather than holding the run forever; the
// others' coverage is kept.
func TestCoverEachCutsATestThatHangsAlone(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.22\n",
		"m.go":   "package m\n\nvar ready bool\n\nfunc Ready() { ready = true }\n",
		"m_test.go": `package m

import (
	"testing"
	"time"
)

func TestFirst(t *testing.T) { Ready() }

// TestSecond leans on TestFirst: alone, it waits for what never comes.
func TestSecond(t *testing.T) {
	for !ready {
		time.Sleep(10 * time.Millisecond)
	}
}
`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	t.Setenv("GOWORK", "off")
	p := &testPkg{path: "example.com/m", dir: dir}
	done := make(chan error, 1)
	go func() {
		_, _, err := coverEach([]*testPkg{p}, "example.com/m", dir, t.TempDir(), 2, 3*time.Second, time.Time{})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("coverEach did not return: a test hanging alone held it")
	}
	if !p.always {
		t.Error("a test that hangs alone: its package is not run whole")
	}
	if want := []string{"TestFirst", "TestSecond"}; !reflect.DeepEqual(p.tests, want) {
		t.Errorf("tests %q, want %q", p.tests, want)
	}
	m := &mutant{file: filepath.Join(dir, "m.go"), line: 5, col: 16, fn: "Ready"}
	if !p.cover["TestFirst"].covers(m) {
		t.Error("TestFirst's coverage alone does not reach Ready")
	}
}

// The budget bounds the coverage of each test too: once it has run out,
// coverEach starts no more tests alone and says how many it left, so that
// the run stops there instead of measuring every test and timing a
// baseline for mutants it will not start (a -since run's 3 minutes were
// spent before keyed's coverage of each test was half done).
func TestCoverEachStartsNoTestPastTheBudget(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"go.mod":    "module example.com/m\n\ngo 1.22\n",
		"m.go":      "package m\n\nfunc F() int { return 1 }\n",
		"m_test.go": "package m\n\nimport \"testing\"\n\nfunc TestFirst(t *testing.T) { F() }\n\nfunc TestSecond(t *testing.T) { F() }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	t.Setenv("GOWORK", "off")
	p := &testPkg{path: "example.com/m", dir: dir}
	ran, left, err := coverEach([]*testPkg{p}, "example.com/m", dir, t.TempDir(), 2, time.Minute, time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ran != 0 || left != 2 || len(p.cover) != 0 {
		t.Errorf("past the budget: %d tests run alone (coverage of %d), %d left; want none run, 2 left", ran, len(p.cover), left)
	}
	p = &testPkg{path: "example.com/m", dir: dir}
	ran, left, err = coverEach([]*testPkg{p}, "example.com/m", dir, t.TempDir(), 2, time.Minute, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if ran != 2 || left != 0 || len(p.cover) != 2 {
		t.Errorf("within the budget: %d tests run alone (coverage of %d), %d left; want 2 run, none left", ran, len(p.cover), left)
	}
}

// A package with few mutants to run runs every selected test for each:
// the coverage of each test alone would cost more than it saves. With
// -all-tests, always.
func TestEveryTestBelowEachFrom(t *testing.T) {
	for _, c := range []struct {
		all       bool
		from, n   int
		everyTest bool
	}{
		{false, 25, 3, true},
		{false, 25, 24, true},
		{false, 25, 25, false},
		{false, 0, 1, false},
		{true, 0, 400, true},
	} {
		if got := everyTest(options{allTests: c.all, eachFrom: c.from}, c.n); got != c.everyTest {
			t.Errorf("all-tests %v, each-from %d, %d mutants: every test %v, want %v", c.all, c.from, c.n, got, c.everyTest)
		}
	}
}

// The baseline is built as a mutant's run is: the measured file replaced,
// so that its package and what imports it are compiled again rather than
// found in the build cache, each build anew; the code is the same.
func TestRebuildOverlayRecompilesTheSameCode(t *testing.T) {
	dir := t.TempDir()
	src := "package m\n\nfunc F() int { return 1 }\n"
	for name, text := range map[string]string{
		"go.mod":    "module example.com/m\n\ngo 1.22\n",
		"m.go":      src,
		"m_test.go": "package m\n\nimport \"testing\"\n\nfunc TestF(t *testing.T) {\n\tif F() != 1 {\n\t\tt.Fatal(F())\n\t}\n}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	t.Setenv("GOWORK", "off")
	tmp := t.TempDir()
	for n := range 2 {
		ov, err := rebuildOverlay("m.go", tmp, n)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("go", "test", "-count=1", "-overlay="+ov, "-json", ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go test with the overlay: %v\n%s", err, out)
		}
		copied, err := os.ReadFile(filepath.Join(tmp, strconv.Itoa(n), "m.go"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(copied), src) || len(copied) == len(src) {
			t.Errorf("overlay %d: %q, want m.go's source and a comment more", n, copied)
		}
	}
	a, _ := os.ReadFile(filepath.Join(tmp, "0", "m.go"))
	b, _ := os.ReadFile(filepath.Join(tmp, "1", "m.go"))
	if string(a) == string(b) {
		t.Error("two builds of the baseline replace m.go with the same text: the second finds the first in the build cache")
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "m.go")); string(after) != src {
		t.Errorf("m.go itself changed: %q", after)
	}
}

// A mutant whose first failing test fails at once is killed then, not
// when the last of the tests it breaks gives up: go test's -failfast
// starts no more tests but lets those already running go on, so a mutant
// that broke the waits of many parallel tests ran until its cut and was
// counted timed out (68 of consumer's in one full run).
func TestExecuteStopsAtTheFirstFailingTest(t *testing.T) {
	dir := t.TempDir()
	src := "package m\n\nfunc F() int { return 2 + 1 }\n"
	for name, text := range map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.22\n",
		"m.go":   src,
		"m_test.go": `package m

import (
	"testing"
	"time"
)

func TestAtOnce(t *testing.T) {
	t.Parallel()
	if F() != 3 {
		t.Fatal(F())
	}
}

// TestWaits waits for what a broken F never gives, as a test waiting on
// a signal does.
func TestWaits(t *testing.T) {
	t.Parallel()
	for F() != 3 {
		time.Sleep(10 * time.Millisecond)
	}
}
`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	t.Setenv("GOWORK", "off")
	m := &mutant{file: "m.go", typ: "ARITHMETIC_BASE", offset: strings.Index(src, "+")}
	runs := [][]string{{"."}}
	// The cut is far longer than the failing test takes: a status other
	// than KILLED means the run waited for TestWaits to the cut.
	if st, err := execute(runs, m, []byte(src), filepath.Join(t.TempDir(), "0"), 45*time.Second); err != nil || st != "KILLED" {
		t.Errorf("a mutant failing one test at once and hanging another: %q, %v; want KILLED", st, err)
	}
	// A mutant both tests pass (3 / 1 for 3 * 1) lives: stopping early
	// judges by the tests alone.
	same := "package m\n\nfunc F() int { return 3 * 1 }\n"
	if st, err := execute(runs, &mutant{file: "m.go", typ: "ARITHMETIC_BASE", offset: strings.Index(same, "*")}, []byte(same), filepath.Join(t.TempDir(), "1"), 45*time.Second); err != nil || st != "LIVED" {
		t.Errorf("a mutant its tests pass: %q, %v; want LIVED", st, err)
	}
	// One that does not compile is not viable, as before.
	broken := "package m\n\nfunc F() int { return 3 }\n\nfunc G() string { return \"a\" + \"b\" }\n"
	if st, err := execute(runs, &mutant{file: "m.go", typ: "ARITHMETIC_BASE", offset: strings.Index(broken, "+")}, []byte(broken), filepath.Join(t.TempDir(), "2"), 45*time.Second); err != nil || st != "NOT VIABLE" {
		t.Errorf("a mutant that does not compile: %q, %v; want NOT VIABLE", st, err)
	}
}

// go test -json's lines reach the watcher in pieces of any size; a
// failing test's report split across writes still stops the command, and
// neither a package's own fail line (a build that failed) nor a test's
// output that names another test's failure does.
func TestWatcherJoinsLinesSplitAcrossWrites(t *testing.T) {
	out := `{"Action":"run","Test":"TestA"}` + "\n" +
		`{"Action":"fail","Package":"example.com/m","Elapsed":0.1}` + "\n" +
		`{"Action":"output","Test":"TestB","Output":"\"Action\":\"fail\"\n"}` + "\n" +
		`{"Action":"output","Test":"TestB","Output":"--- FAIL: TestOther (0.00s)\n"}` + "\n" +
		`{"Action":"output","Test":"TestB/sub","Output":"    --- FAIL: TestB/sub (0.00s)\n"}` + "\n" +
		`{"Action":"fail","Package":"example.com/m","Test":"TestB/sub","Elapsed":0.1}` + "\n" +
		`{"Action":"run","Test":"TestC"}` + "\n"
	stopAt := strings.Index(out, `{"Action":"output","Test":"TestB/sub"`)
	for _, size := range []int{1, 7, 64, len(out)} {
		w := &watcher{stop: failedTest, stopped: make(chan struct{})}
		stopped := -1
		for i := 0; i < len(out); i += size {
			n, err := w.Write([]byte(out[i:min(i+size, len(out))]))
			if err != nil || n != min(size, len(out)-i) {
				t.Fatalf("write of %d bytes: %d, %v", min(size, len(out)-i), n, err)
			}
			select {
			case <-w.stopped:
				if stopped < 0 {
					stopped = min(i+size, len(out))
				}
			default:
			}
		}
		end := strings.Index(out[stopAt:], "\n") + stopAt + 1
		if stopped < end || stopped >= end+size {
			t.Errorf("pieces of %d bytes: stopped after %d bytes, want at the failing test's report's end (%d)", size, stopped, end)
		}
		if string(w.output()) != out {
			t.Errorf("pieces of %d bytes: the output kept is not the output written", size)
		}
	}
}

// The fail event alone stops the command too (a binary whose report line
// test2json did not see as one, or a later go).
func TestFailedTest(t *testing.T) {
	for line, want := range map[string]bool{
		`{"Action":"fail","Package":"p","Test":"TestA","Elapsed":0}`:                                       true,
		`{"Action":"fail","Package":"p","Elapsed":0}`:                                                      false,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"--- FAIL: TestA (1.20s)\n"}`:            true,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (1.20s)\n"}`:            false,
		`{"Action":"output","Package":"p","Output":"--- FAIL: TestA (1.20s)\n"}`:                           false,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    x_test.go:3: --- FAIL: TestA (\n"}`: false,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"        --- FAIL: TestA (0.00s)\n"}`:    false,
		`{"Action":"output","Package":"p","Test":"TestA/b","Output":"    --- FAIL: TestA/b (0.00s)\n"}`:    true,
		`{"Action":"output","Package":"p","Test":"TestA/b","Output":"--- FAIL: TestA/b (0.00s)\n"}`:        false,
		`--- FAIL: TestA (0.00s)`: false,
		`{"Action":"fail"`:        false,
	} {
		if got := failedTest([]byte(line)); got != want {
			t.Errorf("%s: %v, want %v", line, got, want)
		}
	}
}

// A test that passes while logging another run's failure (a child of its
// own test binary, here) is not read as failing: the child's "--- FAIL"
// report reaches the output indented as a log line is, deeper than the
// test's own report would stand.
func TestExecuteReadsNoFailureInATestsLog(t *testing.T) {
	dir := t.TempDir()
	src := "package m\n\nfunc F() int { return 3 * 1 }\n"
	for name, text := range map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.22\n",
		"m.go":   src,
		"m_test.go": `package m

import (
	"os"
	"os/exec"
	"testing"
)

func TestChild(t *testing.T) {
	if os.Getenv("M_CHILD") != "" {
		t.Fatal("the child fails")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.v")
	cmd.Env = append(os.Environ(), "M_CHILD=1")
	out, _ := cmd.CombinedOutput()
	t.Logf("the child said:\n%s", out)
	if F() != 3 {
		t.Fatal(F())
	}
}
`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(dir)
	t.Setenv("GOWORK", "off")
	m := &mutant{file: "m.go", typ: "ARITHMETIC_BASE", offset: strings.Index(src, "*")}
	if st, err := execute([][]string{{"."}}, m, []byte(src), filepath.Join(t.TempDir(), "0"), 45*time.Second); err != nil || st != "LIVED" {
		t.Errorf("a mutant whose test passes, logging a child's failure: %q, %v; want LIVED", st, err)
	}
}

// A build or set-up that failed is read from the package's fail event,
// not from words in a test's log, which -json puts in the output too.
func TestBuildFailed(t *testing.T) {
	build := `{"ImportPath":"example.com/m [example.com/m.test]","Action":"build-fail"}
{"Action":"output","Package":"example.com/m","Output":"FAIL\texample.com/m [build failed]\n"}
{"Action":"fail","Package":"example.com/m","Elapsed":0,"FailedBuild":"example.com/m [example.com/m.test]"}
`
	setup := `{"Action":"output","Package":"example.com/n","Output":"FAIL\texample.com/n [setup failed]\n"}
{"Action":"fail","Package":"example.com/n","Elapsed":0,"FailedBuild":"example.com/n/nope"}
`
	logged := `{"Action":"output","Package":"example.com/m","Test":"TestA","Output":"    a_test.go:9: FAIL\texample.com/m [build failed] \"FailedBuild\"\n"}
{"Action":"fail","Package":"example.com/m","Test":"TestA","Elapsed":0}
FAIL example.com/m [build failed]
{"Action":"fail","Package":"example.com/m","Elapsed":0.2}
`
	for out, want := range map[string]bool{build: true, setup: true, logged: false} {
		if got := buildFailed([]byte(out)); got != want {
			t.Errorf("%s: build failed %v, want %v", out, got, want)
		}
	}
}
