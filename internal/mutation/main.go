// Command mutation is the runner behind scripts/mutation: it measures how
// many of gremlins' mutants of a package the package's real tests kill, with
// those tests wherever they live in the workspace.
//
// gremlins (github.com/go-gremlins/gremlins) finds the mutants: its dry run
// lists each one (file, line, column, mutator), and with -D only those on
// lines a diff changed. It cannot run them here: it copies one module into a
// scratch directory and runs that module's tests, but keyed and idemhttp are
// driven mostly by idemtest's suites run from idemmem, idemsqlite and idempg,
// other modules of the go.work that the copy would not see (their go.mod
// files carry no replace directives). So this runner executes each mutant
// itself, from the repository's root, where the go.work joins the modules:
//
//   - coverage: the package's selected tests run once with -coverpkg naming
//     the package; a mutant no covered block holds is NOT COVERED;
//   - coverage of each test: each test package's binary, built once with
//     coverage of the package, runs each selected top-level test alone,
//     so that a mutant runs only the tests that reach its line (select.go;
//     -all-tests runs them all);
//   - a baseline: the selected tests without coverage, timed, each
//     top-level test's own time too (a mutant's run is cut at
//     -timeout-factor times the baseline of the tests it runs, and is then
//     TIMED OUT);
//   - each covered mutant: the mutated file is written to a scratch
//     directory and handed to `go test -overlay`, so the working tree is
//     never edited and mutants may run side by side (-workers). A run that
//     fails is KILLED, one that passes LIVED, one that does not build NOT
//     VIABLE.
//
// Efficacy is killed ÷ (killed + lived), as gremlins computes it; mutator
// coverage is the share of the mutants the tests reach. The mutants listed in
// docs/mutation-equivalents.txt are left out of both, and a line there that
// matches no mutant of a measured package fails the run (it is stale).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.gremlins, "gremlins", "gremlins", "the gremlins binary")
	flag.StringVar(&o.config, "config", "scripts/mutation.packages", "the packages, floors and test selections")
	flag.StringVar(&o.equivalents, "equivalents", "docs/mutation-equivalents.txt", "the equivalent mutants")
	flag.IntVar(&o.workers, "workers", 1, "mutants run at once")
	flag.IntVar(&o.factor, "timeout-factor", 4, "a mutant's run is cut at this many times the baseline")
	flag.DurationVar(&o.minTimeout, "min-timeout", 30*time.Second, "the shortest cut of a mutant's run")
	flag.StringVar(&o.diff, "diff", "", "only the mutants on lines changed since this commit (git diff -U0 of each file)")
	flag.StringVar(&o.since, "since", "", "measure only the packages whose files changed since this commit, and in them only the mutants on changed lines (implies -diff)")
	flag.DurationVar(&o.budget, "budget", 0, "stop starting mutants, and the coverage and baseline runs that lead to them, after this long (0: no limit); the run then says what it left out")
	flag.BoolVar(&o.verbose, "v", false, "also list every mutant no test reaches")
	flag.BoolVar(&o.coverOnly, "coverage-only", false, "measure only which mutants the tests reach (mutator coverage), running none of them")
	flag.BoolVar(&o.allTests, "all-tests", false, "run every selected test for each mutant, not only the top-level tests that reach its line")
	flag.IntVar(&o.eachFrom, "each-from", 25, "with fewer mutants to run than this in a package, every selected test runs for each (the coverage of each test alone would cost more than it saves)")
	flag.Parse()
	rc, err := run(o, flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutation:", err)
		os.Exit(2)
	}
	os.Exit(rc)
}

type options struct {
	gremlins, config, equivalents, diff string
	since                               string
	workers, factor, eachFrom           int
	minTimeout, budget                  time.Duration
	verbose, coverOnly, allTests        bool
}

// pkgConf is one line of scripts/mutation.packages.
type pkgConf struct {
	no               int // its line in the file
	dir              string
	efficacy, mcover float64
	tests            []testRun
	files            map[string]bool
}

// testRun is one go test command of a package's selection: test packages
// that share a -run pattern (empty: all their tests).
type testRun struct {
	pkgs []string
	run  string
}

func (t testRun) args() []string {
	var a []string
	if t.run != "" {
		a = append(a, "-run", t.run)
	}
	return append(a, t.pkgs...)
}

func (t testRun) String() string {
	s := strings.Join(t.pkgs, " ")
	if t.run != "" {
		s += " -run '" + t.run + "'"
	}
	return s
}

// parseTests reads the test packages field of a line: go test package
// patterns separated by blanks, each optionally followed by =PATTERN, its own
// -run pattern; one without takes the line's -run pattern (def). The
// packages that share a pattern run in one go test command, in the order of
// their first mention.
func parseTests(field, def string) ([]testRun, error) {
	var out []testRun
	at := map[string]int{}
	for _, t := range strings.Fields(field) {
		pkg, run, own := strings.Cut(t, "=")
		if pkg == "" {
			return nil, fmt.Errorf("%q: no test package before =", t)
		}
		if own && run == "" {
			return nil, fmt.Errorf("%q: an empty -run pattern after = (leave out the = to run all its tests)", t)
		}
		if !own {
			run = def
		}
		if _, err := regexp.Compile(run); err != nil {
			return nil, fmt.Errorf("%s: -run pattern: %v", pkg, err)
		}
		i, ok := at[run]
		if !ok {
			i = len(out)
			at[run] = i
			out = append(out, testRun{run: run})
		}
		out[i].pkgs = append(out[i].pkgs, pkg)
	}
	if len(out) == 0 {
		return nil, errors.New("no test packages")
	}
	return out, nil
}

func readConfig(path string) ([]pkgConf, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, err
	}
	var out []pkgConf
	for _, l := range lines {
		f := splitFields(l.text)
		if len(f) != 6 {
			return nil, fmt.Errorf("%s:%d: want 6 fields separated by \" | \", got %d", path, l.no, len(f))
		}
		c := pkgConf{no: l.no, dir: filepath.Clean(f[0])}
		if c.tests, err = parseTests(f[3], f[4]); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, l.no, err)
		}
		if c.efficacy, err = strconv.ParseFloat(f[1], 64); err != nil {
			return nil, fmt.Errorf("%s:%d: efficacy floor: %v", path, l.no, err)
		}
		if c.mcover, err = strconv.ParseFloat(f[2], 64); err != nil {
			return nil, fmt.Errorf("%s:%d: coverage floor: %v", path, l.no, err)
		}
		if fs := strings.Fields(f[5]); len(fs) > 0 {
			c.files = map[string]bool{}
			for _, n := range fs {
				if _, err := os.Stat(filepath.Join(c.dir, n)); err != nil {
					return nil, fmt.Errorf("%s:%d: %v", path, l.no, err)
				}
				c.files[n] = true
			}
		}
		out = append(out, c)
	}
	return out, nil
}

type line struct {
	no   int
	text string
}

// readLines returns the lines of a file that are neither blank nor comments.
func readLines(path string) ([]line, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []line
	for i, l := range strings.Split(string(b), "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		out = append(out, line{i + 1, t})
	}
	return out, nil
}

// splitFields splits a line of scripts/mutation.packages at " | "; an empty
// last field may be left out ("a | b |").
func splitFields(s string) []string {
	f := strings.Split(s+" ", " | ")
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	return f
}

// equivalent is one line of docs/mutation-equivalents.txt.
type equivalent struct {
	no                 int
	path, fn, typ, src string
	nth                int // 0: every mutant of typ on the line
	reason             string
	matched            bool
}

var mutators = map[string]bool{
	"ARITHMETIC_BASE": true, "CONDITIONALS_BOUNDARY": true, "CONDITIONALS_NEGATION": true,
	"INCREMENT_DECREMENT": true, "INVERT_NEGATIVES": true, "INVERT_ASSIGNMENTS": true,
	"INVERT_BITWISE": true, "INVERT_BWASSIGN": true, "INVERT_LOGICAL": true,
	"INVERT_LOOPCTRL": true, "REMOVE_SELF_ASSIGNMENTS": true,
}

func readEquivalents(path string) ([]*equivalent, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, err
	}
	var out []*equivalent
	for _, l := range lines {
		// The source line may hold " | " itself (a bitwise or): the first
		// three fields are split from the left, the reason from the right.
		f := strings.SplitN(l.text, " | ", 4)
		if len(f) == 4 {
			if i := strings.LastIndex(f[3], " | "); i >= 0 {
				f = append(f[:3], f[3][:i], f[3][i+3:])
			}
		}
		if len(f) != 5 {
			return nil, fmt.Errorf("%s:%d: want path | function | MUTATOR | source line | reason", path, l.no)
		}
		e := &equivalent{no: l.no, path: f[0], fn: f[1], typ: f[2], src: f[3], reason: strings.TrimSpace(f[4])}
		if i := strings.IndexByte(e.typ, '@'); i >= 0 {
			n, err := strconv.Atoi(e.typ[i+1:])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%s:%d: %q: the N of MUTATOR@N counts from 1", path, l.no, e.typ)
			}
			e.typ, e.nth = e.typ[:i], n
		}
		if !mutators[e.typ] {
			return nil, fmt.Errorf("%s:%d: unknown mutator %q", path, l.no, e.typ)
		}
		if e.reason == "" || e.src == "" || e.fn == "" {
			return nil, fmt.Errorf("%s:%d: an empty field (every line needs its source line and a reason)", path, l.no)
		}
		out = append(out, e)
	}
	return out, nil
}

// mutant is one of gremlins' mutants, with what this runner learnt of it.
type mutant struct {
	file      string // from the repository's root
	line, col int
	typ       string
	fn, src   string
	nth, of   int // its rank among the mutants of typ on its line, and how many there are
	offset    int
	inCase    *token.Position // the switch whose case expression holds it
	stmt      *token.Position // the innermost statement that holds it
	outside   bool            // not on a line the diff changed
	status    string
	equiv     *equivalent
}

func (m *mutant) pos() string { return fmt.Sprintf("%s:%d:%d", m.file, m.line, m.col) }

func (m *mutant) key() string {
	t := m.typ
	if m.of > 1 {
		t += "@" + strconv.Itoa(m.nth)
	}
	return fmt.Sprintf("%s | %s | %s | %s", m.file, m.fn, t, m.src)
}

func run(o options, args []string) (int, error) {
	confs, err := readConfig(o.config)
	if err != nil {
		return 0, err
	}
	equivs, err := readEquivalents(o.equivalents)
	if err != nil {
		return 0, err
	}
	byDir := map[string]pkgConf{}
	for _, c := range confs {
		byDir[c.dir] = c
	}
	var chosen []pkgConf
	if len(args) == 0 {
		chosen = confs
	}
	for _, a := range args {
		d := filepath.Clean(strings.TrimSuffix(strings.TrimPrefix(a, "./"), "/"))
		if strings.HasPrefix(a, "github.com/idem-go/idem") {
			d = strings.TrimPrefix(strings.TrimPrefix(a, "github.com/idem-go/idem"), "/")
			if d == "" {
				d = "."
			}
		}
		c, ok := byDir[d]
		if !ok {
			return 0, fmt.Errorf("%s is not in %s", a, o.config)
		}
		chosen = append(chosen, c)
	}
	// An equivalent outside every package of the file is a mistake whatever
	// is measured.
	for _, e := range equivs {
		if _, ok := byDir[filepath.Dir(e.path)]; !ok {
			return 0, fmt.Errorf("%s:%d: %s is in no package of %s", o.equivalents, e.no, e.path, o.config)
		}
	}
	if o.since != "" {
		o.diff = o.since
		out, err := exec.Command("git", "diff", "--name-only", o.since, "--", "*.go").Output()
		if err != nil {
			return 0, fmt.Errorf("git diff --name-only %s: %v", o.since, err)
		}
		// A change to the equivalents or to a package's line of the
		// configuration alone touches no Go file, yet can make a line of
		// the equivalents stale (a wrong key, a file taken out of the
		// package's selection): those packages are judged too, their
		// changed lines (none) run no mutant, and the stale check runs.
		var eqDiff, confDiff []byte
		if eqDiff, err = exec.Command("git", "diff", "-U0", o.since, "--", o.equivalents).Output(); err != nil {
			return 0, fmt.Errorf("git diff %s -- %s: %v", o.since, o.equivalents, err)
		}
		if confDiff, err = exec.Command("git", "diff", "-U0", o.since, "--", o.config).Output(); err != nil {
			return 0, fmt.Errorf("git diff %s -- %s: %v", o.since, o.config, err)
		}
		touched := touchedPackages(strings.Fields(string(out)), changedLines(string(eqDiff)), equivs, changedLines(string(confDiff)), confs)
		var keep []pkgConf
		for _, c := range chosen {
			if touched[c.dir] {
				keep = append(keep, c)
			}
		}
		chosen = keep
		if len(chosen) == 0 {
			fmt.Printf("no measured package has a non-test Go file, an equivalent or a line of %s changed since %s\n", o.config, o.since)
			return 0, nil
		}
	}
	start := time.Now()
	var deadline time.Time
	if o.budget > 0 {
		deadline = start.Add(o.budget)
	}
	rc := 0
	var summary []string
	for _, c := range chosen {
		if !deadline.IsZero() && time.Now().After(deadline) {
			summary = append(summary, fmt.Sprintf("%-17s NOT JUDGED: the time budget ran out before it; measure it with scripts/mutation %s", c.dir, c.dir))
			continue
		}
		r, err := measure(o, c, equivs, deadline)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", c.dir, err)
		}
		if r.failed {
			rc = 1
		}
		summary = append(summary, r.line)
	}
	fmt.Println()
	fmt.Printf("== summary (%s, %d worker(s))\n", time.Since(start).Round(time.Second), o.workers)
	for _, s := range summary {
		fmt.Println(s)
	}
	return rc, nil
}

// touchedPackages returns the directories of the measured packages a change
// touched: those with a non-test Go file among files (git diff --name-only),
// an equivalent on a line of eqLines, or their own line of the configuration
// among confLines (the new file's line numbers, from changedLines).
func touchedPackages(files []string, eqLines map[int]bool, equivs []*equivalent, confLines map[int]bool, confs []pkgConf) map[string]bool {
	touched := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, ".go") && !strings.HasSuffix(f, "_test.go") {
			touched[filepath.Dir(f)] = true
		}
	}
	for _, e := range equivs {
		if eqLines[e.no] {
			touched[filepath.Dir(e.path)] = true
		}
	}
	for _, c := range confs {
		if confLines[c.no] {
			touched[c.dir] = true
		}
	}
	return touched
}

// changedLines returns the numbers, in the new file, of the lines a unified
// diff without context (git diff -U0) adds or changes: the "+c,d" of each
// hunk's header. Lines only taken out are in none.
func changedLines(diff string) map[int]bool {
	lines := map[int]bool{}
	for _, l := range strings.Split(diff, "\n") {
		if !strings.HasPrefix(l, "@@ ") {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 3 || !strings.HasPrefix(f[2], "+") {
			continue
		}
		start, count, hasCount := strings.Cut(f[2][1:], ",")
		c, n := 1, 0
		var err error
		if n, err = strconv.Atoi(start); err != nil {
			continue
		}
		if hasCount {
			if c, err = strconv.Atoi(count); err != nil {
				continue
			}
		}
		for i := n; i < n+c; i++ {
			lines[i] = true
		}
	}
	return lines
}

type result struct {
	line   string
	failed bool
}

func measure(o options, c pkgConf, equivs []*equivalent, deadline time.Time) (result, error) {
	var sel []string
	for _, t := range c.tests {
		sel = append(sel, t.String())
	}
	fmt.Printf("== %s (tests: %s)\n", c.dir, strings.Join(sel, "; "))
	importPath, err := goList(c.dir)
	if err != nil {
		return result{}, err
	}
	muts, err := enumerate(o, c)
	if err != nil {
		return result{}, err
	}
	stale := markEquivalents(c, muts.all, equivs)
	for _, e := range stale {
		fmt.Printf("STALE      %s:%d: no mutant matches %s | %s | %s | %s\n", o.equivalents, e.no, e.path, e.fn, e.typ, e.src)
	}
	tmp, err := os.MkdirTemp("", "idem-mutation-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(tmp)

	// Coverage, then the timed baseline. Neither starts once the budget
	// has run out: they would only lead to mutants that are not started.
	pastBudget := func() bool { return !deadline.IsZero() && time.Now().After(deadline) }
	notJudged := func(during string) result {
		line := fmt.Sprintf("%-17s NOT JUDGED: the time budget ran out during its %s, before any of its %d mutant(s) ran; measure it with scripts/mutation %s",
			c.dir, during, len(muts.changed), c.dir)
		fmt.Println(line)
		return result{line: line, failed: len(stale) > 0}
	}
	var runnable []*mutant
	coverStart := time.Now()
	if len(muts.changed) > 0 {
		// Each go test command of the selection has its own profile; a
		// block any of them ran is covered.
		blocks := coverBlocks{}
		for i, t := range c.tests {
			if pastBudget() && !o.coverOnly {
				return notJudged("coverage"), nil
			}
			profile := filepath.Join(tmp, fmt.Sprintf("cover%d.out", i))
			args := append([]string{"test", "-count=1", "-coverpkg=" + importPath, "-coverprofile=" + profile}, t.args()...)
			if out, err := goCmd(context.Background(), args...); err != nil {
				return result{}, fmt.Errorf("the selected tests fail without any mutant (go %s):\n%s", strings.Join(args, " "), out)
			}
			if err := blocks.read(profile, importPath, c.dir); err != nil {
				return result{}, err
			}
		}
		for _, m := range muts.changed {
			switch {
			case m.equiv != nil:
				m.status = "EQUIVALENT"
			case !blocks.covers(m):
				m.status = "NOT COVERED"
			default:
				runnable = append(runnable, m)
			}
		}
	}
	if o.coverOnly {
		count := map[string]int{}
		for _, m := range muts.changed {
			count[m.status]++
			if m.status == "NOT COVERED" {
				fmt.Printf("NOT COVERED %s: %s\n", m.pos(), m.key())
			}
		}
		_, cov := figures(map[string]int{"TIMED OUT": len(runnable), "NOT COVERED": count["NOT COVERED"]})
		line := fmt.Sprintf("%-17s mutator coverage %6.2f%%  (reached %d, not covered %d, equivalent %d); efficacy not measured (-coverage-only)",
			c.dir, cov, len(runnable), count["NOT COVERED"], count["EQUIVALENT"])
		fmt.Println(line)
		return result{line: line, failed: len(stale) > 0}, nil
	}
	// Unless -all-tests, what each top-level test reaches alone, so that a
	// mutant runs only the tests that reach it. That runs every test alone,
	// one process each: more than a few mutants' runs of the whole
	// selection cost, so a package with few mutants to run (a -since run's,
	// say) runs every selected test for each.
	allTests := everyTest(o, len(runnable))
	if allTests && !o.allTests && len(runnable) > 0 {
		fmt.Printf("   %d mutants to run, fewer than -each-from %d: every selected test runs for each\n", len(runnable), o.eachFrom)
	}
	var pkgs []*testPkg
	if len(runnable) > 0 && !allTests {
		t0 := time.Now()
		if pkgs, err = testPackages(c); err != nil {
			return result{}, err
		}
		n, left, err := coverEach(pkgs, importPath, c.dir, tmp, o.workers, aloneCut, deadline)
		if err != nil {
			return result{}, err
		}
		fmt.Printf("   coverage: %s (%d top-level tests over %d test package(s) run one by one: %s)\n",
			time.Since(coverStart).Round(time.Second), n, len(pkgs), time.Since(t0).Round(time.Second))
		if left > 0 {
			return notJudged(fmt.Sprintf("coverage of each test (%d of %d tests not run alone)", left, n+left)), nil
		}
	} else if len(runnable) > 0 {
		fmt.Printf("   coverage: %s\n", time.Since(coverStart).Round(time.Second))
	}
	// The baseline is timed with the measured file rewritten (a comment
	// added), so that it rebuilds what a mutant's run rebuilds: the
	// measured package and every package above it in the test binaries.
	// Timed on a warm build cache instead, the cut would leave a mutant's
	// run little more than its build, and a busy machine would make
	// timed-out mutants of what its tests kill.
	if len(runnable) > 0 && pastBudget() {
		return notJudged("coverage"), nil
	}
	var baseline time.Duration
	rebuild := func(n int) (string, error) {
		return rebuildOverlay(runnable[0].file, filepath.Join(tmp, "baseline"), n)
	}
	if len(runnable) > 0 && allTests {
		t0 := time.Now()
		for i, t := range c.tests {
			ov, err := rebuild(i)
			if err != nil {
				return result{}, err
			}
			args := append([]string{"test", "-count=1", "-overlay=" + ov}, t.args()...)
			if out, err := goCmd(context.Background(), args...); err != nil {
				return result{}, fmt.Errorf("the selected tests fail without any mutant (go %s):\n%s", strings.Join(args, " "), out)
			}
		}
		baseline = time.Since(t0)
	} else if len(runnable) > 0 {
		if err := baselineEach(pkgs, rebuild); err != nil {
			return result{}, err
		}
		for _, p := range pkgs {
			baseline += p.wall
		}
	}
	// Each mutant's go test commands and cut: with -all-tests the line's
	// commands, cut at -timeout-factor times the whole baseline; else the
	// tests that reach it, cut at that many times their own baseline.
	runs := make([][][]string, len(runnable))
	cuts := make([]time.Duration, len(runnable))
	cut := max(time.Duration(o.factor)*baseline, o.minTimeout)
	if allTests {
		var all [][]string
		for _, t := range c.tests {
			all = append(all, t.args())
		}
		for i := range runnable {
			runs[i], cuts[i] = all, cut
		}
		fmt.Printf("   %d mutants (%d on the lines considered), %d to run; baseline %s, cut at %s; every selected test runs for each (-all-tests)\n",
			len(muts.all), len(muts.changed), len(runnable), baseline.Round(100*time.Millisecond), cut.Round(time.Second))
	} else if len(runnable) > 0 {
		tests, picked, every := 0, 0, 0
		for _, p := range pkgs {
			tests += max(len(p.tests), 1)
		}
		lo, hi := cut, time.Duration(0)
		for i, m := range runnable {
			ps := pickTests(m, pkgs)
			for _, p := range ps {
				runs[i] = append(runs[i], p.args())
				if p.tests != nil {
					picked += len(p.tests)
				} else {
					picked += max(len(p.pkg.tests), 1)
				}
			}
			if len(ps) == len(pkgs) && ps[0].tests == nil {
				every++
			}
			cuts[i] = cutFor(ps, o.factor, o.minTimeout)
			lo, hi = min(lo, cuts[i]), max(hi, cuts[i])
		}
		fmt.Printf("   %d mutants (%d on the lines considered), %d to run; baseline %s, cut at %s to %s (%d × the baseline of the tests each runs, at least %s; all tests: %s)\n",
			len(muts.all), len(muts.changed), len(runnable), baseline.Round(100*time.Millisecond), lo.Round(time.Second), hi.Round(time.Second),
			o.factor, o.minTimeout, cut.Round(time.Second))
		fmt.Printf("   each mutant runs the top-level tests that reach its line: %.1f of %d on average; %d run every test (reached by none alone, or package-level)\n",
			float64(picked)/float64(len(runnable)), tests, every)
	} else {
		fmt.Printf("   %d mutants (%d on the lines considered), %d to run\n", len(muts.all), len(muts.changed), len(runnable))
	}

	src := map[string][]byte{}
	for _, m := range runnable {
		if _, ok := src[m.file]; !ok {
			if src[m.file], err = os.ReadFile(m.file); err != nil {
				return result{}, err
			}
		}
	}
	var mu sync.Mutex
	var runErr error
	skipped := handOut(len(runnable), o.workers, deadline, time.Now, func(i int) {
		m := runnable[i]
		st, err := execute(runs[i], m, src[m.file], filepath.Join(tmp, strconv.Itoa(i)), cuts[i])
		mu.Lock()
		defer mu.Unlock()
		if err != nil && runErr == nil {
			runErr = err
		}
		m.status = st
		if st == "LIVED" {
			fmt.Printf("LIVED      %s: %s\n", m.pos(), m.key())
		}
	})
	if runErr != nil {
		return result{}, runErr
	}
	count := map[string]int{}
	for _, m := range muts.changed {
		count[m.status]++
		if o.verbose && m.status == "NOT COVERED" {
			fmt.Printf("NOT COVERED %s: %s\n", m.pos(), m.key())
		}
		if m.status == "TIMED OUT" || m.status == "NOT VIABLE" {
			fmt.Printf("%-10s %s: %s\n", m.status, m.pos(), m.key())
		}
	}
	eff, cov := figures(count)
	verdict, failed := judge(c, eff, cov, len(stale), skipped)
	scope := ""
	if o.diff != "" {
		scope = " [changed lines only]"
	}
	line := fmt.Sprintf("%-17s efficacy %6.2f%%  mutator coverage %6.2f%%  (killed %d, lived %d, timed out %d, not viable %d, not covered %d, equivalent %d)%s  %s",
		c.dir, eff, cov, count["KILLED"], count["LIVED"], count["TIMED OUT"], count["NOT VIABLE"], count["NOT COVERED"], count["EQUIVALENT"], scope, verdict)
	fmt.Println(line)
	return result{line: line, failed: failed}, nil
}

// handOut runs do(i) for each i in [0, n), workers at a time, and starts
// none once now() is past the deadline (zero: no deadline); it returns how
// many it left unstarted. A worker looks at the clock when it is free to
// start the next, not before: a hand-out that checked, then waited for a
// free worker, started a mutant up to a cut past the budget.
func handOut(n, workers int, deadline time.Time, now func() time.Time, do func(i int)) (skipped int) {
	var mu sync.Mutex
	next := 0
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next == n || !deadline.IsZero() && now().After(deadline) {
			return 0, false
		}
		next++
		return next - 1, true
	}
	var wg sync.WaitGroup
	for w := 0; w < max(workers, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, ok := take(); ok; i, ok = take() {
				do(i)
			}
		}()
	}
	wg.Wait()
	return n - next
}

// markEquivalents marks the mutants of c's package that a line of the
// equivalents file names, and returns that package's lines that name none
// (stale: the code changed under them). Lines of files the package's line
// leaves out (its files field) are not judged: none of their mutants is
// listed.
func markEquivalents(c pkgConf, muts []*mutant, equivs []*equivalent) []*equivalent {
	var stale []*equivalent
	for _, e := range equivs {
		if filepath.Dir(e.path) != c.dir || c.files != nil && !c.files[filepath.Base(e.path)] {
			continue
		}
		for _, m := range muts {
			if m.file == e.path && m.fn == e.fn && m.typ == e.typ && m.src == e.src && (e.nth == 0 || e.nth == m.nth) {
				m.equiv, e.matched = e, true
			}
		}
		if !e.matched {
			stale = append(stale, e)
		}
	}
	return stale
}

// figures returns a package's efficacy, killed ÷ (killed + lived), and its
// mutator coverage, reached ÷ (reached + not covered) where reached is
// killed, lived or timed out, both in per cent; counts are by status.
// Equivalent and not viable mutants count in neither. With nothing to
// count, a figure is 100.
func figures(count map[string]int) (eff, cov float64) {
	killed, lived := count["KILLED"], count["LIVED"]
	reached := killed + lived + count["TIMED OUT"]
	eff, cov = 100, 100
	if killed+lived > 0 {
		eff = 100 * float64(killed) / float64(killed+lived)
	}
	if reached+count["NOT COVERED"] > 0 {
		cov = 100 * float64(reached) / float64(reached+count["NOT COVERED"])
	}
	return eff, cov
}

// judge says what a package's figures mean against its floors: a stale
// equivalent fails it whatever its figures; a run the budget cut short is
// not judged; else it fails below either floor.
func judge(c pkgConf, eff, cov float64, stale, skipped int) (verdict string, failed bool) {
	switch {
	case stale > 0:
		return fmt.Sprintf("FAIL: %d stale equivalent(s)", stale), true
	case skipped > 0:
		return fmt.Sprintf("NOT JUDGED: the time budget ran out with %d mutant(s) not run; measure it with scripts/mutation %s", skipped, c.dir), false
	case eff < c.efficacy || cov < c.mcover:
		return fmt.Sprintf("FAIL: below the floors (efficacy %.0f%%, coverage %.0f%%)", c.efficacy, c.mcover), true
	}
	return "ok", false
}

func goList(dir string) (string, error) {
	out, err := exec.Command("go", "list", "./"+dir).Output()
	if err != nil {
		return "", fmt.Errorf("go list ./%s: %v", dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// goCmd runs the go command from the repository's root; on the context's
// end it kills the whole process group (the test binaries too).
func goCmd(ctx context.Context, args ...string) ([]byte, error) {
	return command(ctx, "", "go", args...)
}

// command runs name in dir ("" for the current directory) as goCmd runs
// the go command.
func command(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	return commandUntil(ctx, nil, dir, name, args...)
}

// errStopped is commandUntil's error when its watch stopped the command.
var errStopped = errors.New("stopped by a line of its output")

// commandUntil runs name as command does, and stops it (its whole process
// group) at the first line of its output for which stop says true, if
// stop is not nil.
func commandUntil(ctx context.Context, stop func(line []byte) bool, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	// Its own process group, so that a cut kills the test binaries too;
	// killed with the runner, so that a runner stopped leaves no test
	// running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	w := &watcher{stop: stop, stopped: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var end error
	select {
	case err := <-done:
		return w.output(), err
	case <-ctx.Done():
		end = ctx.Err()
	case <-w.stopped:
		end = errStopped
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
	return w.output(), end
}

// watcher keeps a command's output and closes stopped at the first whole
// line stop says true for. Stdout and stderr share it (one writer, so
// os/exec copies both through one goroutine); the lock keeps it safe all
// the same.
type watcher struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	line    []byte // the line begun and not yet ended, reused: stop keeps none of it
	stop    func(line []byte) bool
	stopped chan struct{}
	closed  bool
}

func (w *watcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	w.buf.Write(p)
	if w.stop == nil || w.closed {
		return n, nil
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.line = append(w.line, p...)
			break
		}
		w.line = append(w.line, p[:i]...)
		p = p[i+1:]
		if w.stop(w.line) {
			w.closed = true
			close(w.stopped)
			w.line = nil
			break
		}
		w.line = w.line[:0]
	}
	return n, nil
}

func (w *watcher) output() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// failedTest says whether a line of go test -json's output tells of a
// test's failure (a subtest's too): its "--- FAIL: name" report, or the
// fail event made of it. The report comes first; go test -json holds the
// event back until the test binary prints its next "=== " line or a
// report of its parent's, and a parallel test left waiting prints none. A
// package's own fail, with no test, is neither: a build that fails says
// so, and is judged not viable.
//
// The report must stand at its test's depth, four spaces a level, as the
// testing package prints it: a passing test that logs another run's
// output (a child process of its own, say) shows "--- FAIL: name" lines
// indented further, and those are not its failure. A subtest whose name
// holds a "/" of its own is deeper than its report: it is missed here and
// stopped by its fail event or the cut, never counted killed wrongly. A
// test that writes such a line to its standard output unindented would
// still be read as failing; none here does.
func failedTest(line []byte) bool {
	if !bytes.Contains(line, []byte(`"Action":"fail"`)) && !bytes.Contains(line, []byte(`--- FAIL: `)) {
		return false
	}
	var e struct{ Action, Test, Output string }
	if json.Unmarshal(line, &e) != nil || e.Test == "" {
		return false
	}
	switch e.Action {
	case "fail":
		return true
	case "output":
		depth := strings.Repeat("    ", strings.Count(e.Test, "/"))
		return strings.HasPrefix(e.Output, depth+"--- FAIL: "+e.Test+" (")
	}
	return false
}

// buildFailed says whether go test -json's output tells that a package's
// test binary was not built (its code or its vet failed) or could not be
// set up: the package's fail event naming the build that failed. Tests'
// output is not read: with -json every test's log is in the output, and a
// log that quotes a failed build says nothing of this one.
func buildFailed(out []byte) bool {
	for line := range bytes.Lines(out) {
		if !bytes.Contains(line, []byte(`"FailedBuild"`)) {
			continue
		}
		var e struct{ Action, Test, FailedBuild string }
		if json.Unmarshal(line, &e) == nil && e.Action == "fail" && e.Test == "" && e.FailedBuild != "" {
			return true
		}
	}
	return false
}

// everyTest says whether every selected test runs for each of n mutants
// to run: with -all-tests, or when n is below -each-from.
func everyTest(o options, n int) bool {
	return o.allTests || n < o.eachFrom
}

// rebuildOverlay writes, under dir, a go test -overlay file that replaces
// file with itself and a comment more, naming n: a build with it
// recompiles file's package and what imports it, as a mutant's does (a
// different n for each build, so that none finds the last one's in the
// build cache), and runs the same code.
func rebuildOverlay(file, dir string, n int) (string, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	copied := filepath.Join(dir, filepath.Base(file))
	if err := os.WriteFile(copied, fmt.Appendf(src, "\n// rebuilt for the baseline (%d)\n", n), 0o644); err != nil {
		return "", err
	}
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: copied}})
	overlay := filepath.Join(dir, "overlay.json")
	return overlay, os.WriteFile(overlay, ov, 0o644)
}

// execute runs go test commands (their arguments after the flags this
// adds: -run patterns and test packages) with one mutant overlaid.
func execute(runs [][]string, m *mutant, src []byte, dir string, cut time.Duration) (string, error) {
	mutated, err := apply(src, m)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	abs, err := filepath.Abs(m.file)
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, filepath.Base(m.file))
	if err := os.WriteFile(file, mutated, 0o644); err != nil {
		return "", err
	}
	ov, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: file}})
	overlay := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlay, ov, 0o644); err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	// The cut holds for the whole selection; its go test commands run one
	// after another, and the first that fails decides. A command is
	// stopped at its first failing test: -failfast starts no test more,
	// but those already running in parallel would go on to their ends,
	// and a mutant that breaks their waits would be cut and counted timed
	// out though a test had failed at once.
	ctx, cancel := context.WithTimeout(context.Background(), cut)
	defer cancel()
	for _, r := range runs {
		args := append([]string{"test", "-count=1", "-failfast", "-json", "-overlay=" + overlay, "-timeout=" + (cut + 30*time.Second).String()}, r...)
		out, err := commandUntil(ctx, failedTest, "", "go", args...)
		switch {
		case errors.Is(err, errStopped):
			return "KILLED", nil
		case errors.Is(err, context.DeadlineExceeded):
			return "TIMED OUT", nil
		case err == nil:
			continue
		case buildFailed(out):
			return "NOT VIABLE", nil
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "KILLED", nil
		}
		return "", err
	}
	return "LIVED", nil
}

// The replacements gremlins' mutators make (its internal/engine/mappings.go).
var replacement = map[string]map[token.Token]token.Token{
	"ARITHMETIC_BASE":       {token.ADD: token.SUB, token.MUL: token.QUO, token.QUO: token.MUL, token.REM: token.MUL, token.SUB: token.ADD},
	"CONDITIONALS_BOUNDARY": {token.GEQ: token.GTR, token.GTR: token.GEQ, token.LEQ: token.LSS, token.LSS: token.LEQ},
	"CONDITIONALS_NEGATION": {token.EQL: token.NEQ, token.GEQ: token.LSS, token.GTR: token.LEQ, token.LEQ: token.GTR, token.LSS: token.GEQ, token.NEQ: token.EQL},
	"INCREMENT_DECREMENT":   {token.DEC: token.INC, token.INC: token.DEC},
	"INVERT_ASSIGNMENTS":    {token.ADD_ASSIGN: token.SUB_ASSIGN, token.MUL_ASSIGN: token.QUO_ASSIGN, token.QUO_ASSIGN: token.MUL_ASSIGN, token.REM_ASSIGN: token.REM_ASSIGN, token.SUB_ASSIGN: token.ADD_ASSIGN},
	"INVERT_BITWISE":        {token.AND: token.OR, token.OR: token.AND, token.XOR: token.AND, token.AND_NOT: token.AND, token.SHL: token.SHR, token.SHR: token.SHL},
	"INVERT_BWASSIGN":       {token.AND_ASSIGN: token.OR_ASSIGN, token.OR_ASSIGN: token.AND_ASSIGN, token.XOR_ASSIGN: token.AND_ASSIGN, token.AND_NOT_ASSIGN: token.AND_ASSIGN, token.SHL_ASSIGN: token.SHR_ASSIGN, token.SHR_ASSIGN: token.SHL_ASSIGN},
	"INVERT_LOGICAL":        {token.LAND: token.LOR, token.LOR: token.LAND},
	"INVERT_LOOPCTRL":       {token.BREAK: token.CONTINUE, token.CONTINUE: token.BREAK},
	"INVERT_NEGATIVES":      {token.SUB: token.ADD},
	"REMOVE_SELF_ASSIGNMENTS": {
		token.ADD_ASSIGN: token.ASSIGN, token.AND_ASSIGN: token.ASSIGN, token.AND_NOT_ASSIGN: token.ASSIGN,
		token.MUL_ASSIGN: token.ASSIGN, token.OR_ASSIGN: token.ASSIGN, token.QUO_ASSIGN: token.ASSIGN,
		token.REM_ASSIGN: token.ASSIGN, token.SHL_ASSIGN: token.ASSIGN, token.SHR_ASSIGN: token.ASSIGN,
		token.SUB_ASSIGN: token.ASSIGN, token.XOR_ASSIGN: token.ASSIGN,
	},
}

// apply returns src with m's token replaced as gremlins replaces it.
func apply(src []byte, m *mutant) ([]byte, error) {
	var s scanner.Scanner
	fs := token.NewFileSet()
	f := fs.AddFile(m.file, -1, len(src))
	s.Init(f, src, nil, scanner.ScanComments)
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if f.Offset(pos) != m.offset {
			continue
		}
		to, ok := replacement[m.typ][tok]
		if !ok {
			return nil, fmt.Errorf("%s: %s does not apply to %q", m.pos(), m.typ, tok.String()+lit)
		}
		out := append([]byte{}, src[:m.offset]...)
		out = append(out, to.String()...)
		return append(out, src[m.offset+len(tok.String()):]...), nil
	}
	return nil, fmt.Errorf("%s: no token there", m.pos())
}

type mutants struct {
	all     []*mutant // every mutant of the package
	changed []*mutant // those on the lines considered (all, or those -diff changed)
}

// enumerate asks gremlins for the package's mutants, then names each by its
// function and source line.
func enumerate(o options, c pkgConf) (mutants, error) {
	modRoot, err := moduleRoot(c.dir)
	if err != nil {
		return mutants{}, err
	}
	rel, err := filepath.Rel(modRoot, c.dir)
	if err != nil {
		return mutants{}, err
	}
	all, err := dryRun(o, modRoot, rel, o.diff)
	if err != nil {
		return mutants{}, err
	}
	var ms mutants
	files := map[string]*fileInfo{}
	for _, m := range all {
		base := filepath.Base(m.file)
		if c.files != nil && !c.files[base] {
			continue
		}
		fi, ok := files[m.file]
		if !ok {
			if fi, err = parseFile(m.file); err != nil {
				return mutants{}, err
			}
			files[m.file] = fi
		}
		if err := fi.describe(m); err != nil {
			return mutants{}, err
		}
		ms.all = append(ms.all, m)
		if !m.outside {
			ms.changed = append(ms.changed, m)
		}
	}
	// Rank the mutants of one type on one line, left to right.
	sort.SliceStable(ms.all, func(i, j int) bool {
		a, b := ms.all[i], ms.all[j]
		if a.file != b.file {
			return a.file < b.file
		}
		if a.line != b.line {
			return a.line < b.line
		}
		return a.col < b.col
	})
	group := map[string][]*mutant{}
	for _, m := range ms.all {
		k := fmt.Sprintf("%s:%d %s", m.file, m.line, m.typ)
		group[k] = append(group[k], m)
	}
	for _, g := range group {
		for i, m := range g {
			m.nth, m.of = i+1, len(g)
		}
	}
	return ms, nil
}

func moduleRoot(dir string) (string, error) {
	d := dir
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if d == "." || d == "/" {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		d = filepath.Dir(d)
	}
}

// dryRun lists gremlins' mutants of the package in dir (from modRoot), its
// own files only. Its coverage pass builds and runs nothing (go test -n):
// this runner measures coverage with the tests the package's line selects.
func dryRun(o options, modRoot, dir, diff string) ([]*mutant, error) {
	out, err := os.CreateTemp("", "idem-gremlins-*.json")
	if err != nil {
		return nil, err
	}
	out.Close()
	defer os.Remove(out.Name())
	// The changed lines are found here, not by gremlins' own -D: gremlins
	// matches git's paths (from the repository's root) with its files'
	// names (from the package's directory), so outside the root package it
	// found no line changed and a -since run measured nothing.
	args := []string{"unleash", "--dry-run", "--silent", "--workers", "1", "-E", "/", "-o", out.Name()}
	args = append(args, "./"+dir)
	cmd := exec.Command(o.gremlins, args...)
	cmd.Dir = modRoot
	cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -n"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("gremlins %s (in %s): %v\n%s", strings.Join(args, " "), modRoot, err, b)
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, err
	}
	var rep struct {
		Files []struct {
			FileName  string `json:"file_name"`
			Mutations []struct {
				Type   string `json:"type"`
				Status string `json:"status"`
				Line   int    `json:"line"`
				Column int    `json:"column"`
			} `json:"mutations"`
		} `json:"files"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("gremlins' report: %v", err)
	}
	var ms []*mutant
	for _, f := range rep.Files {
		for _, m := range f.Mutations {
			ms = append(ms, &mutant{file: filepath.Join(modRoot, dir, f.FileName), line: m.Line, col: m.Column, typ: m.Type})
		}
	}
	if diff != "" {
		if err := markOutsideDiff(ms, diff); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// markOutsideDiff marks the mutants on lines that did not change since the
// commit diff (git diff -U0 of each mutant's file, by its absolute path,
// so that a package's place in the repository does not matter).
func markOutsideDiff(ms []*mutant, diff string) error {
	changed := map[string]map[int]bool{}
	for _, m := range ms {
		lines, ok := changed[m.file]
		if !ok {
			cmd := exec.Command("git", "diff", "-U0", diff, "--", filepath.Base(m.file))
			cmd.Dir = filepath.Dir(m.file)
			out, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("git diff -U0 %s -- %s: %v", diff, m.file, err)
			}
			lines = changedLines(string(out))
			changed[m.file] = lines
		}
		m.outside = !lines[m.line]
	}
	return nil
}

type fileInfo struct {
	src   []byte
	fset  *token.FileSet
	file  *token.File
	funcs []funcSpan
	cases []caseSpan
	stmts []stmtSpan
}

// stmtSpan is a statement. A cover profile's blocks end where a function
// literal starts and resume in its body, so what follows the literal in
// the statement that holds it (`if strings.IndexFunc(s, func...) >= 0 {`)
// is in no block: a mutant there counts as reached when its statement is.
type stmtSpan struct {
	from, to token.Pos
}

// caseSpan is the expression list of a switch's case clause. A cover
// profile's blocks leave those out (a block starts after the case's colon),
// so a mutant in one counts as reached when its switch statement is.
type caseSpan struct {
	from, to token.Pos
	sw       token.Position
}

type funcSpan struct {
	from, to token.Pos
	name     string
}

func parseFile(path string) (*fileInfo, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	af, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	fi := &fileInfo{src: src, fset: fset, file: fset.File(af.Pos())}
	ast.Inspect(af, func(n ast.Node) bool {
		switch n.(type) {
		case *ast.BlockStmt, *ast.CaseClause, *ast.CommClause:
		case ast.Stmt:
			fi.stmts = append(fi.stmts, stmtSpan{n.Pos(), n.End()})
		}
		sw, ok := n.(*ast.SwitchStmt)
		if !ok {
			return true
		}
		for _, st := range sw.Body.List {
			cc := st.(*ast.CaseClause)
			if len(cc.List) > 0 {
				fi.cases = append(fi.cases, caseSpan{cc.List[0].Pos(), cc.List[len(cc.List)-1].End(), fset.Position(sw.Pos())})
			}
		}
		return true
	})
	for _, d := range af.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) > 0 {
			t := fd.Recv.List[0].Type
			for {
				switch x := t.(type) {
				case *ast.StarExpr:
					t = x.X
					continue
				case *ast.IndexExpr:
					t = x.X
					continue
				case *ast.IndexListExpr:
					t = x.X
					continue
				}
				break
			}
			if id, ok := t.(*ast.Ident); ok {
				name = id.Name + "." + name
			}
		}
		fi.funcs = append(fi.funcs, funcSpan{fd.Pos(), fd.End(), name})
	}
	return fi, nil
}

func (fi *fileInfo) describe(m *mutant) error {
	if m.line < 1 || m.line > fi.file.LineCount() {
		return fmt.Errorf("%s: gremlins names a line the file does not have", m.pos())
	}
	start := fi.file.Offset(fi.file.LineStart(m.line))
	m.offset = start + m.col - 1
	end := start
	for end < len(fi.src) && fi.src[end] != '\n' {
		end++
	}
	m.src = strings.TrimSpace(string(fi.src[start:end]))
	p := fi.file.Pos(m.offset)
	m.fn = "-"
	for _, c := range fi.cases {
		if c.from <= p && p < c.to {
			sw := c.sw
			m.inCase = &sw
		}
	}
	for _, f := range fi.funcs {
		if f.from <= p && p < f.to {
			m.fn = f.name
		}
	}
	// Statements nest, and ast.Inspect lists the outer first: the last one
	// holding p is the innermost.
	for _, st := range fi.stmts {
		if st.from <= p && p < st.to {
			pos := fi.fset.Position(st.from)
			m.stmt = &pos
		}
	}
	return nil
}

// coverBlocks are the blocks of the cover profiles, by file; hit when a
// test ran them.
type coverBlocks map[string][]coverBlock

type coverBlock struct {
	from, to [2]int // line, column
	hit      bool
}

// read adds the blocks of the package importPath (whose directory is dir)
// that the cover profile at path holds.
func (cb coverBlocks) read(path, importPath, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "mode:") {
			continue
		}
		// importpath/file.go:L1.C1,L2.C2 statements count
		colon := strings.LastIndex(l, ":")
		if colon < 0 {
			continue
		}
		name := l[:colon]
		if filepath.Dir(name) != importPath {
			continue
		}
		var b [4]int
		var stmts, cnt int
		if _, err := fmt.Sscanf(l[colon+1:], "%d.%d,%d.%d %d %d", &b[0], &b[1], &b[2], &b[3], &stmts, &cnt); err != nil {
			return fmt.Errorf("cover profile line %q: %v", l, err)
		}
		file := filepath.Join(dir, filepath.Base(name))
		cb[file] = append(cb[file], coverBlock{[2]int{b[0], b[1]}, [2]int{b[2], b[3]}, cnt > 0})
	}
	return sc.Err()
}

// covers says whether the tests reached m: a block they ran holds it, or,
// in a case expression, its switch, or, in no block (after a function
// literal in its statement), its statement. A mutant outside every function and
// every block (a package-level constant or variable's initialiser) is
// evaluated when the package is built and loaded, so it is reached when
// the tests ran any of the package.
func (cb coverBlocks) covers(m *mutant) bool {
	if m.inCase != nil {
		return cb.reached(m.file, m.inCase.Line, m.inCase.Column, true)
	}
	if m.stmt != nil && !cb.reached(m.file, m.line, m.col, false) {
		return cb.reached(m.file, m.stmt.Line, m.stmt.Column, true)
	}
	if m.fn == "-" && !cb.reached(m.file, m.line, m.col, false) {
		for _, bs := range cb {
			for _, b := range bs {
				if b.hit {
					return true
				}
			}
		}
		return false
	}
	return cb.reached(m.file, m.line, m.col, true)
}

// reached says whether a block holds the position, one a test ran when hit.
func (cb coverBlocks) reached(file string, line, col int, hit bool) bool {
	for _, b := range cb[file] {
		after := line > b.from[0] || line == b.from[0] && col >= b.from[1]
		before := line < b.to[0] || line == b.to[0] && col < b.to[1]
		if after && before && (b.hit || !hit) {
			return true
		}
	}
	return false
}
