package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Each mutant runs only the tests that reach its line: a test that never
// executes the mutated line cannot observe the mutation. What each
// top-level test reaches is measured with that test run alone (its
// package's test binary, built once with coverage of the measured
// package, run once per test), so goroutines that other tests leave
// behind do not blur the map.

// testPkg is one test package of a line's selection, as the selection of
// tests per mutant sees it.
type testPkg struct {
	path  string // its import path
	dir   string // its directory, where its test binary runs
	run   string // the line's -run pattern for it ("" for all its tests)
	whole bool   // the pattern names subtests: it runs as a whole, never split
	// always: one of its tests failed run alone (it leans on another test
	// having run first), so its selection runs whole for every mutant.
	always bool
	// tests are its top-level tests the pattern selects, in the binary's
	// order; cover what each reached run alone (one entry, "", when whole).
	tests []string
	cover map[string]coverBlocks
	// The baseline: the wall time of go test over its selection, and its
	// test binary's run in it (the rest is building and linking); alone,
	// each test's run by itself in the coverage phase.
	wall, binary time.Duration
	alone        map[string]time.Duration
}

// pick is one go test command of a mutant's run: tests of one test
// package, nil for its whole selection.
type pick struct {
	pkg   *testPkg
	tests []string
}

func (p pick) args() []string {
	run := p.pkg.run
	if p.tests != nil {
		q := make([]string, len(p.tests))
		for i, t := range p.tests {
			q[i] = regexp.QuoteMeta(t)
		}
		run = "^(" + strings.Join(q, "|") + ")$"
	}
	if run == "" {
		return []string{p.pkg.path}
	}
	return []string{"-run", run, p.pkg.path}
}

func (p pick) String() string { return strings.Join(p.args(), " ") }

// baseline is the picked tests' baseline: the package's build (its
// baseline's wall time less its test binary's run) and the time the tests
// took run alone, those together never more than the binary's whole run.
// The tests' times within the baseline's own run are no measure: parallel
// tests there share the machine, each taking about as long as the whole.
func (p pick) baseline() time.Duration {
	if p.tests == nil {
		return p.pkg.wall
	}
	var some time.Duration
	for _, t := range p.tests {
		some += p.pkg.alone[t]
	}
	return max(0, p.pkg.wall-p.pkg.binary) + min(p.pkg.binary, some)
}

// cutFor is the cut of a mutant's run of picks: factor times their
// baseline, at least floor.
func cutFor(picks []pick, factor int, floor time.Duration) time.Duration {
	var b time.Duration
	for _, p := range picks {
		b += p.baseline()
	}
	return max(time.Duration(factor)*b, floor)
}

// pickTests returns what m's run runs, one pick per test package in the
// line's order: the top-level tests that reached m run alone; a package
// none of whose tests did is left out, and one a test of which failed
// alone runs whole. When no test alone reached it (the whole selection
// did, or it would not be run: coverage that varies from run to run; a
// package run whole for a test failing alone is no sign that one did) or
// m is in a package-level declaration (whose value a test may read
// without running any block of the package), every selected test runs.
func pickTests(m *mutant, pkgs []*testPkg) []pick {
	var out []pick
	// reached: some test alone reached m. A package run whole because a
	// test of it fails alone is picked whatever its tests reached, so it
	// is no sign of that.
	reached := false
	if m.fn != "-" {
		for _, p := range pkgs {
			if p.always {
				out = append(out, pick{p, nil})
				for _, c := range p.cover {
					reached = reached || c.covers(m)
				}
				continue
			}
			if p.whole {
				if p.cover[""].covers(m) {
					out = append(out, pick{p, nil})
					reached = true
				}
				continue
			}
			var ts []string
			for _, t := range p.tests {
				if p.cover[t].covers(m) {
					ts = append(ts, t)
				}
			}
			if ts != nil {
				out = append(out, pick{p, ts})
				reached = true
			}
		}
	}
	if !reached {
		out = nil
		for _, p := range pkgs {
			out = append(out, pick{p, nil})
		}
	}
	return out
}

// runsSubtests says whether a -run pattern names subtests (a / splits it
// by level), which the list of top-level tests cannot split.
func runsSubtests(run string) bool { return strings.Contains(run, "/") }

var testName = regexp.MustCompile(`^(Test|Example|Fuzz)[\p{L}\p{N}_]*$`)

// parseTestList reads a test binary's -test.list output: the tests,
// examples and fuzz targets (benchmarks do not run under -run).
func parseTestList(out string) []string {
	var ts []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); testName.MatchString(l) {
			ts = append(ts, l)
		}
	}
	return ts
}

// parseTestTimes reads go test -json: each top-level test's own time, and
// under "" the test binary's.
func parseTestTimes(out []byte) map[string]time.Duration {
	times := map[string]time.Duration{}
	for _, l := range strings.Split(string(out), "\n") {
		var ev struct {
			Action, Test string
			Elapsed      float64
		}
		if json.Unmarshal([]byte(l), &ev) != nil || strings.Contains(ev.Test, "/") {
			continue
		}
		switch ev.Action {
		case "pass", "fail", "skip":
			times[ev.Test] = time.Duration(ev.Elapsed * float64(time.Second))
		}
	}
	return times
}

// testPackages expands the line's test packages (go list), in its order.
func testPackages(c pkgConf) ([]*testPkg, error) {
	var out []*testPkg
	for _, t := range c.tests {
		args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}"}, t.pkgs...)
		b, err := goCmd(context.Background(), args...)
		if err != nil {
			return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			path, dir, ok := strings.Cut(l, "\t")
			if !ok {
				return nil, fmt.Errorf("go %s: %q", strings.Join(args, " "), l)
			}
			out = append(out, &testPkg{path: path, dir: dir, run: t.run, whole: runsSubtests(t.run)})
		}
	}
	return out, nil
}

// coverEach builds each test package's test binary once with coverage of
// the measured package and runs it once per top-level test the line's
// pattern selects (once, whole, when the pattern names subtests), workers
// at a time, keeping what each reached; a run is cut after cut, as go
// test's -timeout cuts one. It starts none once past deadline (zero: no
// deadline), as handOut starts no mutant. It returns how many runs it made
// and how many the deadline left unmade.
func coverEach(pkgs []*testPkg, importPath, measuredDir, tmp string, workers int, cut time.Duration, deadline time.Time) (ran, left int, err error) {
	type job struct {
		p    *testPkg
		name string
	}
	var jobs []job
	for i, p := range pkgs {
		p.cover, p.alone = map[string]coverBlocks{}, map[string]time.Duration{}
		bin := filepath.Join(tmp, fmt.Sprintf("t%d.test", i))
		args := []string{"test", "-c", "-cover", "-covermode=set", "-coverpkg=" + importPath, "-o", bin, p.path}
		if out, err := goCmd(context.Background(), args...); err != nil {
			return 0, 0, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if _, err := os.Stat(bin); err != nil {
			continue // no test files: nothing to run
		}
		if p.whole {
			jobs = append(jobs, job{p, ""})
			continue
		}
		list := p.run
		if list == "" {
			list = "."
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := command(ctx, p.dir, bin, "-test.list", list)
		cancel()
		if err != nil {
			return 0, 0, fmt.Errorf("%s -test.list %q: %v\n%s", p.path, list, err, out)
		}
		p.tests = parseTestList(string(out))
		for _, t := range p.tests {
			jobs = append(jobs, job{p, t})
		}
	}
	bins := map[*testPkg]string{}
	for i, p := range pkgs {
		bins[p] = filepath.Join(tmp, fmt.Sprintf("t%d.test", i))
	}
	var mu sync.Mutex
	left = handOut(len(jobs), workers, deadline, time.Now, func(i int) {
		j := jobs[i]
		profile := filepath.Join(tmp, fmt.Sprintf("each%d.out", i))
		run := "^" + regexp.QuoteMeta(j.name) + "$"
		if j.p.whole {
			run = j.p.run
		}
		// Cut as go test cuts a binary (and, should it hang outside
		// its tests, in TestMain, killed a little later): a test
		// that hangs alone fails alone.
		ctx, cancel := context.WithTimeout(context.Background(), cut+30*time.Second)
		t0 := time.Now()
		// -test.paniconexit0 as go test passes it (a test calling
		// os.Exit(0) already fails here: the profile is written
		// only after the tests).
		out, err := command(ctx, j.p.dir, bins[j.p], "-test.paniconexit0", "-test.run", run, "-test.count=1", "-test.timeout="+cut.String(), "-test.coverprofile="+profile)
		took := time.Since(t0)
		cancel()
		cb := coverBlocks{}
		if err == nil {
			err = cb.read(profile, importPath, measuredDir)
		}
		mu.Lock()
		if err != nil && !j.p.always {
			j.p.always = true
			fmt.Printf("   %s -test.run '%s' fails run alone, without any mutant (%v): every mutant runs all of %s's selected tests\n%s\n",
				j.p.path, run, err, j.p.path, indent(lastLines(string(out), 15)))
		}
		j.p.cover[j.name], j.p.alone[j.name] = cb, took
		mu.Unlock()
	})
	return len(jobs) - left, left, nil
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

func indent(s string) string { return "      " + strings.ReplaceAll(s, "\n", "\n      ") }

// baselineEach times each test package's selection (go test -json, one
// package at a time, each built with the overlay rebuild(i) gives: one
// that makes it recompile what a mutant's run recompiles), keeping its
// wall time and each top-level test's.
func baselineEach(pkgs []*testPkg, rebuild func(int) (string, error)) error {
	for i, p := range pkgs {
		overlay, err := rebuild(i)
		if err != nil {
			return err
		}
		args := append([]string{"test", "-count=1", "-json", "-overlay=" + overlay}, pick{p, nil}.args()...)
		t0 := time.Now()
		out, err := goCmd(context.Background(), args...)
		if err != nil {
			return fmt.Errorf("the selected tests fail without any mutant (go %s):\n%s", strings.Join(args, " "), out)
		}
		p.wall = time.Since(t0)
		p.binary = parseTestTimes(out)[""]
	}
	return nil
}

// aloneCut is how long a test may run alone in the coverage of each test:
// go test's own default -timeout.
const aloneCut = 10 * time.Minute
