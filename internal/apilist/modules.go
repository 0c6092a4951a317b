package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/tools/go/packages"
)

// A module is one Go module of the repository.
type module struct {
	dir  string // slash-separated and relative to the root; "." for the root
	path string // the module path its go.mod declares
}

// file names the module's listing under api/: its directory with "/" made
// "_", and for the root module the last element of its path.
func (m module) file() string {
	if m.dir == "." {
		return path.Base(m.path) + ".txt"
	}
	return strings.ReplaceAll(m.dir, "/", "_") + ".txt"
}

// findRoot returns the repository's root above dir: the nearest directory
// holding go.work, or else the outermost one holding go.mod. The walk stops
// at the top of the git repository, so a stray go.mod above it is not taken.
func findRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	top := ""
	for d := dir; ; d = filepath.Dir(d) {
		if exists(filepath.Join(d, "go.work")) {
			return d, nil
		}
		if exists(filepath.Join(d, "go.mod")) {
			top = d
		}
		if exists(filepath.Join(d, ".git")) || filepath.Dir(d) == d {
			break
		}
	}
	if top == "" {
		return "", fmt.Errorf("no go.work or go.mod in %s or above it", dir)
	}
	return top, nil
}

func exists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// discoverModules finds every go.mod under root, skipping the directories
// the go command skips in patterns (testdata, and names starting with "."
// or "_") and the module whose path is self, which is this tool's: it has
// no API, and loading it would only cost time.
func discoverModules(root, self string) ([]module, error) {
	var mods []module
	err := filepath.WalkDir(root, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			base := d.Name()
			if name != root && (base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		modPath := modfile.ModulePath(data)
		if modPath == "" {
			return fmt.Errorf("%s: no module line", name)
		}
		if modPath == self {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(name))
		if err != nil {
			return err
		}
		mods = append(mods, module{dir: filepath.ToSlash(rel), path: modPath})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("no module under %s", root)
	}
	slices.SortFunc(mods, func(a, b module) int { return strings.Compare(a.dir, b.dir) })
	return mods, nil
}

// loadMode asks for what the listing and the import graph need. Without
// NeedSyntax, go/packages reads the packages' types from the compiler's
// export data, which the build cache mostly already holds.
const loadMode = packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedTypes

// A listing is the API lines of one module, sorted.
type listing struct {
	mod   module
	lines []string
}

// listModules loads every module's packages and returns each module's
// listing, in the order of mods. env is the go command's environment; with
// a go.work above the modules, loading is in workspace mode.
func listModules(root string, mods []module, env []string) ([]listing, error) {
	loaded := make([][]*packages.Package, len(mods))
	for i, m := range mods {
		cfg := &packages.Config{
			Mode: loadMode,
			Dir:  filepath.Join(root, filepath.FromSlash(m.dir)),
			Env:  env,
		}
		pkgs, err := packages.Load(cfg, "./...")
		if err != nil {
			return nil, fmt.Errorf("loading module %s (%s): %w", m.path, m.dir, err)
		}
		loaded[i] = pkgs
	}
	if err := loadErrors(mods, loaded); err != nil {
		return nil, err
	}

	// An internal package imported by a package of another module is API
	// between the two. Every package counts as an importer here, commands
	// too: a command in one module that imports another's internal package
	// breaks when that package changes as much as a library does.
	shared := make(map[string]bool)
	for i, pkgs := range loaded {
		for _, p := range pkgs {
			for _, imp := range p.Imports {
				impPath := importPath(imp)
				if isInternal(impPath) {
					if o := owner(mods, impPath); o >= 0 && o != i {
						shared[impPath] = true
					}
				}
			}
		}
	}

	listings := make([]listing, len(mods))
	for i, pkgs := range loaded {
		listings[i].mod = mods[i]
		for _, p := range pkgs {
			if p.Name == "main" || !hasCode(p) || isInternal(p.PkgPath) && !shared[p.PkgPath] {
				continue
			}
			listings[i].lines = append(listings[i].lines, apiLines(p.Types)...)
		}
		slices.Sort(listings[i].lines)
	}
	return listings, nil
}

// loadErrors gathers the errors of each module's packages and of what they
// import, each once, under the module they were met in.
func loadErrors(mods []module, loaded [][]*packages.Package) error {
	seen := make(map[string]bool)
	var b strings.Builder
	for i, pkgs := range loaded {
		var msgs []string
		packages.Visit(pkgs, nil, func(p *packages.Package) {
			for _, e := range p.Errors {
				msg := e.Error()
				if p.PkgPath != "" && !strings.Contains(msg, p.PkgPath) {
					msg = p.PkgPath + ": " + msg
				}
				// The go command's messages run over several lines.
				msg = strings.ReplaceAll(strings.TrimSpace(msg), "\n", "\n\t  ")
				if !seen[msg] {
					seen[msg] = true
					msgs = append(msgs, msg)
				}
			}
		})
		if len(msgs) > 0 {
			fmt.Fprintf(&b, "\nmodule %s in %s:\n\t%s", mods[i].path, mods[i].dir, strings.Join(msgs, "\n\t"))
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return errors.New("packages do not load or type-check:" + b.String())
}

// hasCode reports whether p has Go files other than tests.
func hasCode(p *packages.Package) bool {
	return len(p.GoFiles) > 0 || len(p.CompiledGoFiles) > 0
}

// importPath returns the path of an imported package: without NeedDeps
// go/packages may give an import only its ID, which outside tests is its
// path.
func importPath(p *packages.Package) string {
	if p.PkgPath != "" {
		return p.PkgPath
	}
	return p.ID
}

// isInternal reports whether a package path has an element "internal", so
// that the go command lets only packages under its parent import it.
func isInternal(pkgPath string) bool {
	return slices.Contains(strings.Split(pkgPath, "/"), "internal")
}

// owner returns the index in mods of the module holding the package with
// the given path, the one with the longest module path that is a prefix of
// it, or -1 when none is.
func owner(mods []module, pkgPath string) int {
	best := -1
	for i, m := range mods {
		if pkgPath == m.path || strings.HasPrefix(pkgPath, m.path+"/") {
			if best < 0 || len(m.path) > len(mods[best].path) {
				best = i
			}
		}
	}
	return best
}
