package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// writeTree writes files, named by slash-separated paths under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// diff shows what got lacks (-) and has too many (+) against want.
func diff(want, got []string) string {
	var b bytes.Buffer
	writeDiff(&b, want, got)
	return b.String()
}

// TestAPILines lists small packages, each of one case, loaded through
// go/packages from a module of their own as the tool loads idem's, and
// compares every line.
func TestAPILines(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string
	}{{
		name: "funcs",
		src: `package funcs

import "context"

func F(ctx context.Context, b []byte, r rune, opts ...string) (n int, err error) { return 0, nil }
func G() {}
func H(f func(x int) (y string)) error { return nil }
func hidden() {}
`,
		want: []string{
			"func F(context.Context, []uint8, int32, ...string) (int, error)",
			"func G()",
			"func H(func(int) string) error",
		},
	}, {
		name: "consts",
		src: `package consts

type State int

const (
	StateNew State = iota
	StateDone
)

const (
	Limit  = 3
	Name   = "idem"
	Third  = 1.0 / 3
	Half   = 0.5
	On     = true
	hidden = 1
)
`,
		want: []string{
			"const Half = 0.5",
			"const Half ideal-float",
			"const Limit = 3",
			"const Limit ideal-int",
			`const Name = "idem"`,
			"const Name ideal-string",
			"const On = true",
			"const On ideal-bool",
			"const StateDone = 1",
			"const StateDone State",
			"const StateNew = 0",
			"const StateNew State",
			"const Third = 0.333333 // 1/3",
			"const Third ideal-float",
			"type State int",
		},
	}, {
		name: "vars",
		src: `package vars

import (
	"errors"
	"unsafe"

	"example.com/m/dep"
)

var (
	ErrGone = errors.New("gone")
	Chans   chan (<-chan int)
	Done    <-chan struct{}
	Send    chan<- []byte
	Table   map[string][2]*deppkg.T
	Point   struct {
		X, Y  int
		label string
	}
	Any   any
	Empty interface{}
	Sizer interface{ Size(name string) int64 }
	Ptr   unsafe.Pointer
	Box   deppkg.Box[int]
	hidden int
)
`,
		want: []string{
			"var Any any",
			"var Box deppkg.Box[int]",
			"var Chans chan (<-chan int)",
			"var Done <-chan struct{}",
			"var Empty interface{}",
			"var ErrGone error",
			"var Point struct{ X int; Y int; label string }",
			"var Ptr unsafe.Pointer",
			"var Send chan<- []uint8",
			"var Sizer interface{ Size(string) int64 }",
			"var Table map[string][2]*deppkg.T",
		},
	}, {
		name: "structs",
		src: `package structs

import (
	"io"

	"example.com/m/dep"
)

type Base struct{ ID string }

type inner struct{ Hidden int }

func (inner) Promoted() {}

type S struct {
	Name   string
	count  int
	OnDone func(err error)
	*Base
	deppkg.T
	inner
	io.Reader
}

func (s *S) Set(name string) error { return nil }
func (s S) Get() string             { return "" }
func (s *S) reset()                 {}

type Opaque struct{ x int }

type Handler func(w io.Writer) error

func (h Handler) Serve(w io.Writer) error { return h(w) }
`,
		want: []string{
			"method (*S) Set(string) error",
			"method (Handler) Serve(io.Writer) error",
			"method (S) Get() string",
			"type Base struct",
			"type Base struct, ID string",
			"type Handler func(io.Writer) error",
			"type Opaque struct",
			"type S struct",
			"type S struct, Name string",
			"type S struct, OnDone func(error)",
			"type S struct, embedded *Base",
			"type S struct, embedded deppkg.T",
			"type S struct, embedded io.Reader",
		},
	}, {
		name: "ifaces",
		src: `package ifaces

import (
	"context"
	"io"
)

type Store interface {
	io.Closer
	Claim(ctx context.Context, key string) (bool, error)
}

type Sealed interface {
	Name() string
	seal()
}

type Empty interface{}

type Number interface{ ~int | ~float64 }

type Key interface {
	comparable
	String() string
}
`,
		want: []string{
			"type Empty interface {}",
			"type Key interface { String }",
			"type Key interface, String() string",
			"type Key interface, comparable",
			"type Number interface, ~int | ~float64",
			"type Sealed interface { Name }",
			"type Sealed interface, Name() string",
			"type Sealed interface, unexported methods",
			"type Store interface { Claim, Close }",
			"type Store interface, Claim(context.Context, string) (bool, error)",
			"type Store interface, Close() error",
		},
	}, {
		name: "generics",
		src: `package generics

type List[E any] struct{ Items []E }

func (l *List[E]) Push(v E) {}

func Map[T, U any](s []T, f func(T) U) []U { return nil }

func Keys[M ~map[K]V, K comparable, V any](m M) []K { return nil }

type Pair[K comparable, V any] struct {
	Key   K
	Value V
}

type Names = List[string]

type Seq[T any] = func(yield func(T) bool)
`,
		want: []string{
			"func Keys[$0 ~map[$1]$2, $1 comparable, $2 any]($0) []$1",
			"func Map[$0 any, $1 any]([]$0, func($0) $1) []$1",
			"method (*List[$0]) Push($0)",
			"type List[$0 any] struct",
			"type List[$0 any] struct, Items []$0",
			"type Names = List[string]",
			"type Pair[$0 comparable, $1 any] struct",
			"type Pair[$0 comparable, $1 any] struct, Key $0",
			"type Pair[$0 comparable, $1 any] struct, Value $1",
			"type Seq[$0 any] = func(func($0) bool)",
		},
	}}

	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.26.0\n",
		// The package's name differs from its directory's, so that the
		// lines show which of the two qualifies a type.
		"dep/dep.go": "package deppkg\n\ntype T struct{}\n\ntype Box[V any] struct{ v V }\n",
	}
	for _, c := range cases {
		files[c.name+"/"+c.name+".go"] = c.src
	}
	writeTree(t, dir, files)
	cfg := &packages.Config{Mode: loadMode, Dir: dir, Env: append(os.Environ(), "GOWORK=off")}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if err := loadErrors([]module{{dir: ".", path: "example.com/m"}}, [][]*packages.Package{pkgs}); err != nil {
		t.Fatal(err)
	}
	byPath := make(map[string]*packages.Package)
	for _, p := range pkgs {
		byPath[p.PkgPath] = p
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pkgPath := "example.com/m/" + c.name
			p := byPath[pkgPath]
			if p == nil {
				t.Fatalf("%s was not loaded", pkgPath)
			}
			var want []string
			for _, w := range c.want {
				want = append(want, "pkg "+pkgPath+", "+w)
			}
			slices.Sort(want)
			if got := apiLines(p.Types); !slices.Equal(got, want) {
				t.Errorf("lines differ (- wanted, + got):\n%s", diff(want, got))
			}
		})
	}
}

// TestRunAcrossModules runs the tool on a workspace of three modules and
// checks which packages it lists, that a listing it wrote matches, and
// that a changed signature, a listing of a module gone and a package that
// does not compile each fail the check as they should.
func TestRunAcrossModules(t *testing.T) {
	self := selfModule()
	if self == "" {
		t.Fatal("no module path in the test binary's build information")
	}
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"go.work": "go 1.26.0\n\nuse (\n\t.\n\t./sub\n\t./cmd/tool\n)\n",
		"go.mod":  "module example.com/r\n\ngo 1.26.0\n",
		"r.go":    "package r\n\nfunc Version() string { return \"1\" }\n",
		// shared is imported by sub's package, cmdonly by the command
		// in cmd/tool, private by nothing outside its own module.
		"internal/shared/shared.go":   "package shared\n\nfunc Encode(b []byte) string { return string(b) }\n",
		"internal/cmdonly/cmdonly.go": "package cmdonly\n\nconst Usage = \"tool\"\n",
		"internal/private/private.go": "package private\n\nfunc Secret() int { return 1 }\n",
		"internal/private/use.go":     "package private\n\nimport \"example.com/r/internal/shared\"\n\nvar _ = shared.Encode\n",
		"onlytests/x_test.go":         "package onlytests\n\nfunc Exported() {}\n",
		// Modules that must not be loaded: one in testdata, and one
		// with this tool's module path. Both would fail to compile.
		"testdata/go.mod": "module example.com/broken\n\ngo 1.26.0\n",
		"testdata/x.go":   "package broken\n\nfunc (\n",
		"self/go.mod":     "module " + self + "\n\ngo 1.26.0\n",
		"self/x.go":       "package broken\n\nfunc (\n",

		"sub/go.mod": "module example.com/r/sub\n\ngo 1.26.0\n",
		"sub/sub.go": "package sub\n\nimport \"example.com/r/internal/shared\"\n\nfunc Encode(b []byte) string { return shared.Encode(b) }\n",

		"cmd/tool/go.mod":  "module example.com/r/cmd/tool\n\ngo 1.26.0\n",
		"cmd/tool/main.go": "package main\n\nimport \"example.com/r/internal/cmdonly\"\n\nfunc main() { println(cmdonly.Usage) }\n",
	})
	env := append(os.Environ(), "GOWORK="+filepath.Join(root, "go.work"))
	apiFile := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, "api", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	runTool := func(want int, args ...string) (stdout, stderr string) {
		t.Helper()
		var out, errs bytes.Buffer
		if got := run(append([]string{"-root", root}, args...), env, &out, &errs); got != want {
			t.Fatalf("%v exited %d, want %d\nstdout:\n%s\nstderr:\n%s", args, got, want, out.String(), errs.String())
		}
		return out.String(), errs.String()
	}

	runTool(0, "-w")
	if got, want := apiFile("r.txt"), "# API of example.com/r. Regenerate with scripts/api -w; see docs/releasing.md.\n"+
		"pkg example.com/r, func Version() string\n"+
		"pkg example.com/r/internal/cmdonly, const Usage = \"tool\"\n"+
		"pkg example.com/r/internal/cmdonly, const Usage ideal-string\n"+
		"pkg example.com/r/internal/shared, func Encode([]uint8) string\n"; got != want {
		t.Errorf("api/r.txt:\n%s\nwant:\n%s", got, want)
	}
	if got, want := apiFile("sub.txt"), "# API of example.com/r/sub. Regenerate with scripts/api -w; see docs/releasing.md.\n"+
		"pkg example.com/r/sub, func Encode([]uint8) string\n"; got != want {
		t.Errorf("api/sub.txt:\n%s\nwant:\n%s", got, want)
	}
	if _, err := os.Stat(filepath.Join(root, "api", "cmd_tool.txt")); err == nil {
		t.Error("api/cmd_tool.txt written for a module of commands only")
	}
	runTool(0)

	writeTree(t, root, map[string]string{
		"sub/sub.go": "package sub\n\nimport \"example.com/r/internal/shared\"\n\nfunc Encode(b []byte, pad bool) string { return shared.Encode(b) }\n",
	})
	stdout, stderr := runTool(1)
	if want := "--- api/sub.txt\n+++ api/sub.txt\n" +
		"-pkg example.com/r/sub, func Encode([]uint8) string\n" +
		"+pkg example.com/r/sub, func Encode([]uint8, bool) string\n"; stdout != want {
		t.Errorf("diff:\n%s\nwant:\n%s", stdout, want)
	}
	if !strings.Contains(stderr, "scripts/api -w") || !strings.Contains(stderr, "CHANGELOG.md") {
		t.Errorf("the message does not say what to do:\n%s", stderr)
	}
	// Only the root module is asked for: sub's change goes unseen.
	runTool(0, ".")
	runTool(0, "-w")
	runTool(0)

	writeTree(t, root, map[string]string{
		"api/gone.txt":  "# API of example.com/r/gone. Regenerate with scripts/api -w; see docs/releasing.md.\npkg example.com/r/gone, func F()\n",
		"api/notes.txt": "not a listing\n",
	})
	stdout, _ = runTool(1)
	if want := "--- api/gone.txt\n+++ /dev/null\n-pkg example.com/r/gone, func F()\n"; stdout != want {
		t.Errorf("diff:\n%s\nwant:\n%s", stdout, want)
	}
	runTool(0, "-w")
	if _, err := os.Stat(filepath.Join(root, "api", "gone.txt")); err == nil {
		t.Error("-w kept the listing of a module that is gone")
	}
	if _, err := os.Stat(filepath.Join(root, "api", "notes.txt")); err != nil {
		t.Errorf("-w removed a file that is no listing: %v", err)
	}

	writeTree(t, root, map[string]string{
		"sub/sub.go": "package sub\n\nfunc Encode(b []byte) string { return undefined(b) }\n",
	})
	_, stderr = runTool(2)
	if !strings.Contains(stderr, "undefined") || !strings.Contains(stderr, "sub.go") {
		t.Errorf("the type error is not shown:\n%s", stderr)
	}

	// A module left out of go.work cannot be loaded in workspace mode;
	// it must not pass as a module without API.
	writeTree(t, root, map[string]string{
		"sub/sub.go":   "package sub\n\nfunc Encode(b []byte) string { return string(b) }\n",
		"extra/go.mod": "module example.com/r/extra\n\ngo 1.26.0\n",
		"extra/x.go":   "package extra\n\nfunc X() {}\n",
	})
	_, stderr = runTool(2)
	if !strings.Contains(stderr, "example.com/r/extra") || !strings.Contains(stderr, "go.work") {
		t.Errorf("the module missing from go.work is not named:\n%s", stderr)
	}
}

func TestWriteDiff(t *testing.T) {
	cases := []struct {
		name     string
		old, new []string
		want     string
	}{
		{"same", []string{"a", "b"}, []string{"a", "b"}, ""},
		{"added", []string{"a"}, []string{"a", "b"}, "+b\n"},
		{"removed", []string{"a", "b"}, nil, "-a\n-b\n"},
		// The new line sorts before the old one; the old one still comes
		// first, as in a unified diff.
		{"changed", []string{"f(int) // x", "g"}, []string{"f(int)", "g"}, "-f(int) // x\n+f(int)\n"},
		{"two runs", []string{"a", "b1", "c", "d1"}, []string{"a0", "b", "c", "d"}, "-a\n-b1\n+a0\n+b\n-d1\n+d\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			writeDiff(&b, c.old, c.new)
			if got := b.String(); got != c.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}
