package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// Messages name the script that runs the tool, which is what a reader of
// CI's log would run again.
const prog = "scripts/api"

// run does the work of main and returns the exit status: 0 when the
// listings match the code (or were written), 1 when they do not, 2 on any
// error.
func run(args, env []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet(prog, flag.ContinueOnError)
	flags.SetOutput(stderr)
	write := flags.Bool("w", false, "write the listings under api/ rather than compare the code with them")
	rootFlag := flags.String("root", "", "the repository's `dir`ectory (default: the one holding go.work above the working directory, or else the outermost with a go.mod)")
	flags.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s [-w] [-root dir] [module dir ...]\n\n", prog)
		fmt.Fprintf(stderr, "Compares each module's exported API with its listing under api/, or with -w\nwrites the listings. Module dirs are relative to the root (\".\" is the root\nmodule); by default every module is done.\n\n")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return 2
	}

	fail := func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 2
	}
	root := *rootFlag
	if root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fail(err)
		}
		if root, err = findRoot(wd); err != nil {
			return fail(err)
		}
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return fail(err)
	}
	mods, err := discoverModules(root, selfModule())
	if err != nil {
		return fail(err)
	}
	only, err := selected(mods, flags.Args())
	if err != nil {
		return fail(err)
	}

	// Every module is loaded even when only some are asked for: whether an
	// internal package is listed depends on what the other modules import.
	listings, err := listModules(root, mods, env)
	if err != nil {
		return fail(err)
	}
	if only != nil {
		listings = slices.DeleteFunc(listings, func(l listing) bool { return !only[l.mod.dir] })
	}
	apiDir := filepath.Join(root, "api")
	if *write {
		if err := writeListings(apiDir, listings, only == nil, stderr); err != nil {
			return fail(err)
		}
		return 0
	}
	same, err := compare(apiDir, listings, only == nil, stdout)
	if err != nil {
		return fail(err)
	}
	if !same {
		fmt.Fprintf(stderr, "\n%s: the exported API differs from its listing under api/ (- listed, + in the code).\n", prog)
		fmt.Fprintf(stderr, "If the change is meant, run %s -w, commit the files under api/ with it,\nand note the change in the Unreleased section of CHANGELOG.md.\n", prog)
		return 1
	}
	return 0
}

// selfModule returns this tool's module path, so that discovery passes
// over its own module.
func selfModule() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Path
	}
	return ""
}

// selected returns the set of module directories named on the command
// line, or nil when none is, meaning all.
func selected(mods []module, dirs []string) (map[string]bool, error) {
	if len(dirs) == 0 {
		return nil, nil
	}
	only := make(map[string]bool)
	for _, d := range dirs {
		d = filepath.ToSlash(filepath.Clean(d))
		if !slices.ContainsFunc(mods, func(m module) bool { return m.dir == d }) {
			return nil, fmt.Errorf("%s is not a module directory under the root", d)
		}
		only[d] = true
	}
	return only, nil
}

// header opens every listing. Lines starting with # are comments, and
// blank lines are ignored, when a listing is read.
func header(m module) string {
	return "# API of " + m.path + ". Regenerate with scripts/api -w; see docs/releasing.md.\n"
}

// readListing returns the API lines of a listing file, sorted, and whether
// the file exists.
func readListing(name string) ([]string, bool, error) {
	data, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, true, fmt.Errorf("%s: %w", name, err)
	}
	slices.Sort(lines)
	return slices.Compact(lines), true, nil
}

// stale returns the listing files under apiDir that no module makes any
// more (a module removed or moved), recognised by the header: other files
// there are left alone.
func stale(apiDir string, listings []listing) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(apiDir, "*.txt"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range names {
		base := filepath.Base(name)
		if slices.ContainsFunc(listings, func(l listing) bool { return l.mod.file() == base }) {
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		if bytes.HasPrefix(data, []byte("# API of ")) {
			out = append(out, name)
		}
	}
	return out, nil
}

// compare prints, for each listing that differs from its file, the lines
// removed (-) and added (+), and reports whether all matched. With all
// set, listing files of modules that no longer exist count as removed.
func compare(apiDir string, listings []listing, all bool, w io.Writer) (bool, error) {
	same := true
	for _, l := range listings {
		name := filepath.Join(apiDir, l.mod.file())
		old, found, err := readListing(name)
		if err != nil {
			return false, err
		}
		if slices.Equal(old, l.lines) {
			continue
		}
		same = false
		from, to := "api/"+l.mod.file(), "api/"+l.mod.file()
		if !found {
			from = "/dev/null"
		}
		if len(l.lines) == 0 {
			to = "/dev/null"
		}
		fmt.Fprintf(w, "--- %s\n+++ %s\n", from, to)
		writeDiff(w, old, l.lines)
	}
	if all {
		gone, err := stale(apiDir, listings)
		if err != nil {
			return false, err
		}
		for _, name := range gone {
			old, _, err := readListing(name)
			if err != nil {
				return false, err
			}
			same = false
			fmt.Fprintf(w, "--- api/%s\n+++ /dev/null\n", filepath.Base(name))
			writeDiff(w, old, nil)
		}
	}
	return same, nil
}

// writeDiff writes the lines only in old with "-" and those only in new
// with "+". Both are sorted, so the lines of one declaration are next to
// each other; each run of differing lines between lines in common is
// written as a unified diff would, its removals before its additions, so a
// changed signature shows as its old line over its new one.
func writeDiff(w io.Writer, old, new []string) {
	var removed, added []string
	flush := func() {
		for _, line := range removed {
			fmt.Fprintf(w, "-%s\n", line)
		}
		for _, line := range added {
			fmt.Fprintf(w, "+%s\n", line)
		}
		removed, added = removed[:0], added[:0]
	}
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new) || i < len(old) && old[i] < new[j]:
			removed = append(removed, old[i])
			i++
		case i == len(old) || new[j] < old[i]:
			added = append(added, new[j])
			j++
		default:
			flush()
			i++
			j++
		}
	}
	flush()
}

// writeListings writes each listing's file, removes the file of a module
// that lists nothing, and with all set the files of modules that no longer
// exist. It says on w which files it changed.
func writeListings(apiDir string, listings []listing, all bool, w io.Writer) error {
	for _, l := range listings {
		name := filepath.Join(apiDir, l.mod.file())
		if len(l.lines) == 0 {
			if err := os.Remove(name); err == nil {
				fmt.Fprintf(w, "%s: removed api/%s\n", prog, l.mod.file())
			} else if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			continue
		}
		content := header(l.mod) + strings.Join(l.lines, "\n") + "\n"
		if old, err := os.ReadFile(name); err == nil && string(old) == content {
			continue
		}
		if err := os.MkdirAll(apiDir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s: wrote api/%s (%d lines)\n", prog, l.mod.file(), len(l.lines))
	}
	if !all {
		return nil
	}
	gone, err := stale(apiDir, listings)
	if err != nil {
		return err
	}
	for _, name := range gone {
		if err := os.Remove(name); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s: removed api/%s\n", prog, filepath.Base(name))
	}
	return nil
}
