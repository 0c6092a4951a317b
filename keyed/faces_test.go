package keyed_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// storeMethods are the calls that decide a key's fate: only the engine
// makes them.
var storeMethods = []string{"Claim", "ClaimTx", "Complete", "CompleteTx", "Release", "ReleaseWithPoint", "Yield", "SaveRecovery", "Renew"}

// storeCalls returns, as "file:line X.Method", the calls to storeMethods
// in src, the engine's own functions among them: a face that offers one
// (idemhttp.SaveRecovery) is that function, not a call of it.
func storeCalls(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !slices.Contains(storeMethods, sel.Sel.Name) {
			return true
		}
		found = append(found, fset.Position(call.Pos()).String()+" ."+sel.Sel.Name)
		return true
	})
	return found, nil
}

// The faces make no store call of their own: every decision about a key is
// the engine's, so that a rule decided once holds on every face. This
// reads the faces' source (not their tests, which set stores up and look
// inside them) for calls that only the engine may make.
func TestFacesMakeNoStoreCall(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	// The scan finds what it looks for.
	found, err := storeCalls(fset, "probe.go", `package p
func f() { s.Claim(ctx, "a"); x.store.CompleteTx(ctx); keyed.SaveRecovery(ctx, "n", nil); idem.Store(nil).Release(ctx) }`)
	if err != nil || len(found) != 4 {
		t.Fatalf("the scan of a file with four store calls found %q, %v", found, err)
	}
	if _, err := os.Stat("../go.work"); err != nil {
		// idemgrpc and the examples are modules of their own, absent from
		// this module's download: the check is the repository's.
		t.Skip("not in idem's repository (no go.work): the faces' sources are not all here")
	}
	faces := []string{"../idemhttp", "../idemgrpc", "../examples/jsonrpc"}
	for _, dir := range faces {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s (%v): a face moved, and this test must follow it", dir, err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			calls, err := storeCalls(fset, file, src)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				t.Errorf("%s: a face calls the store; only the engine (keyed) may", c)
			}
		}
	}
}
