// Command testreport reads the event stream of `go test -json` on its
// standard input and prints what a plain `go test` would have printed (each
// package's ok or FAIL line, and the whole output of every test that failed),
// then, at the end, the slowest tests and each package's wall time, so that
// whoever reads a CI log sees where its minutes went. With -o it also keeps
// the raw stream in a file, for tools that want every event.
//
// It never decides whether the run passed: scripts/test takes that from
// go test's own exit status.
//
//	go test -json ./... | go run ./internal/testreport -o .artifacts/test.json
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

func main() {
	out := flag.String("o", "", "also write the raw event stream to this file")
	top := flag.Int("top", 15, "how many of the slowest tests to list")
	flag.Parse()

	var in io.Reader = os.Stdin
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
		defer f.Close()
		in = io.TeeReader(os.Stdin, f)
	}
	r := newReport(os.Stdout)
	if err := r.read(in); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
	}
	r.summary(*top)
}

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // on build-output and build-fail
}

type testKey struct{ pkg, test string }

type timing struct {
	name    string
	elapsed time.Duration
	failed  bool
}

type report struct {
	w io.Writer
	// pending holds the output of each test still running, printed whole
	// if the test fails (and dropped if it passes, as plain go test does).
	pending map[testKey][]string
	// pkgOut is the output of a package outside any test: printed whole
	// if the package fails, only its summary line if it passes.
	pkgOut   map[string][]string
	build    map[string][]string
	tests    []timing
	packages []timing
	skipped  int
}

func newReport(w io.Writer) *report {
	return &report{w: w, pending: map[testKey][]string{}, pkgOut: map[string][]string{}, build: map[string][]string{}}
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event (go test prints some errors as plain text):
			// pass it on unchanged.
			fmt.Fprintf(r.w, "%s\n", line)
			continue
		}
		r.add(e)
	}
	return sc.Err()
}

func (r *report) add(e event) {
	switch e.Action {
	case "build-output":
		r.build[e.ImportPath] = append(r.build[e.ImportPath], e.Output)
		return
	case "build-fail":
		r.flush(r.build[e.ImportPath])
		delete(r.build, e.ImportPath)
		return
	}
	k := testKey{e.Package, e.Test}
	if e.Test == "" {
		switch e.Action {
		case "output":
			r.pkgOut[e.Package] = append(r.pkgOut[e.Package], e.Output)
		case "pass", "skip":
			for _, l := range r.pkgOut[e.Package] {
				if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "? ") || strings.HasPrefix(l, "ok\t") || strings.HasPrefix(l, "?\t") {
					fmt.Fprint(r.w, l)
				}
			}
			r.endPackage(e, false)
		case "fail":
			// Tests that never ended (a timeout, a panic, a crash) are
			// shown with all they printed before the package's own output,
			// which says why the binary stopped.
			var open []testKey
			for tk := range r.pending {
				if tk.pkg == e.Package {
					open = append(open, tk)
				}
			}
			sort.Slice(open, func(i, j int) bool { return open[i].test < open[j].test })
			for _, tk := range open {
				r.flush(r.pending[tk])
				delete(r.pending, tk)
			}
			r.flush(r.pkgOut[e.Package])
			r.endPackage(e, true)
		}
		return
	}
	switch e.Action {
	case "output":
		r.pending[k] = append(r.pending[k], e.Output)
	case "pass", "skip":
		if e.Action == "skip" {
			r.skipped++
		}
		delete(r.pending, k)
		r.addTest(e, false)
	case "fail":
		r.flush(r.pending[k])
		delete(r.pending, k)
		r.addTest(e, true)
	}
}

func (r *report) flush(lines []string) {
	for _, l := range lines {
		fmt.Fprint(r.w, l)
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (r *report) addTest(e event, failed bool) {
	// Subtests are counted in their top-level test's time.
	if strings.Contains(e.Test, "/") {
		return
	}
	r.tests = append(r.tests, timing{name: e.Package + "." + e.Test, elapsed: seconds(e.Elapsed), failed: failed})
}

func (r *report) endPackage(e event, failed bool) {
	delete(r.pkgOut, e.Package)
	if e.Action == "skip" { // no test files
		return
	}
	r.packages = append(r.packages, timing{name: e.Package, elapsed: seconds(e.Elapsed), failed: failed})
}

func (r *report) summary(top int) {
	// Output of packages that never ended (the stream was cut): show it,
	// so that nothing a failing run printed is lost.
	cut := map[string]bool{}
	for p := range r.pkgOut {
		cut[p] = true
	}
	for tk := range r.pending {
		cut[tk.pkg] = true
	}
	var names []string
	for p := range cut {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		var open []string
		for tk := range r.pending {
			if tk.pkg == p {
				open = append(open, tk.test)
			}
		}
		sort.Strings(open)
		for _, t := range open {
			r.flush(r.pending[testKey{p, t}])
		}
		r.flush(r.pkgOut[p])
	}

	byTime := func(ts []timing) {
		sort.SliceStable(ts, func(i, j int) bool {
			if ts[i].elapsed != ts[j].elapsed {
				return ts[i].elapsed > ts[j].elapsed
			}
			return ts[i].name < ts[j].name
		})
	}
	byTime(r.tests)
	byTime(r.packages)
	if len(r.tests) > top {
		r.tests = r.tests[:top]
	}
	fmt.Fprintf(r.w, "\n== slowest %d tests\n", len(r.tests))
	for _, t := range r.tests {
		fmt.Fprintf(r.w, "%9s  %s%s\n", t.elapsed.Round(10*time.Millisecond), t.name, mark(t.failed))
	}
	var total time.Duration
	for _, p := range r.packages {
		total += p.elapsed
	}
	fmt.Fprintf(r.w, "\n== wall time per package (%d packages, %s in all, %d tests skipped)\n", len(r.packages), total.Round(time.Second), r.skipped)
	for _, p := range r.packages {
		fmt.Fprintf(r.w, "%9s  %s%s\n", p.elapsed.Round(10*time.Millisecond), p.name, mark(p.failed))
	}
}

func mark(failed bool) string {
	if failed {
		return "  FAIL"
	}
	return ""
}
