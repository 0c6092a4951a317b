// Command apilist keeps the record of every idem module's exported API, so
// that no change to it goes unnoticed.
//
// A release of one idem module has to keep working with the modules it is
// released beside, and a program that upgrades idem has to know what it is
// getting. Both depend on every change to an exported name, signature,
// field, method or constant being seen and written down, so the API is
// listed in files under api/ at the repository's root, one per module, and
// CI fails when the code and the listing disagree.
//
// The listing is made from the type-checked packages (golang.org/x/tools/go/packages)
// of each module: every go.mod under the root, less those in testdata and
// hidden directories and this tool's own module. For each package it writes
// one line per exported element, in the form of the Go project's api files:
//
//	pkg github.com/idem-go/idem/idemhttp, func New(*Config) (*Middleware, error)
//	pkg github.com/idem-go/idem/idemhttp, type Config struct, Store idem.Store
//	pkg github.com/idem-go/idem/idemhttp, method (*Middleware) Handler(http.Handler) http.Handler
//	pkg github.com/idem-go/idem, type Store interface, Claim(context.Context, ClaimRequest) (Claim, error)
//	pkg github.com/idem-go/idem, const StateCompleted State
//	pkg github.com/idem-go/idem, const StateCompleted = 2
//
// Types from other packages are named by package name, parameter and result
// names are left out, byte and rune are written uint8 and int32, and type
// parameters are numbered ($0, $1, …), so that a line changes only when the
// API does. A constant's value is listed as well as its type: values are
// stored and sent, so changing one changes what a program means. An
// interface is listed with the names of all its exported methods on one
// line, so that a method added to it, which breaks every implementation
// outside the package, shows as a change of that line too.
//
// Packages named main and those with only test files are left out, and so
// are internal packages, except an internal package that a package of
// another module imports: Go lets the modules of this repository import
// each other's internal packages, and a package so imported is API between
// them, released in one module and used from another, so it is listed with
// the module that holds it. Which internal packages those are is worked out
// from the imports of every module's packages on each run.
//
// The API is listed for the platform the tool runs on; idem's exported API
// is the same on every platform, and a file with build constraints that
// declared exported names would make the listing differ between machines.
//
// # Use
//
// scripts/api runs it from the repository's root. Without flags it compares
// the code with api/ and exits 1, printing the lines that differ (- listed,
// + in the code) for each module, when they do not agree; CI runs it so. A
// change to the API that is meant is recorded by running
//
//	scripts/api -w
//
// which rewrites the files under api/, and by a note in the Unreleased
// section of CHANGELOG.md; the diff of api/ in the commit shows reviewers
// exactly what changed. Arguments name module directories (relative to the
// root, "." for the root module) to check or write only those. -root names
// the repository's root; by default it is the directory holding go.work
// above the working directory, or else the outermost directory with a
// go.mod. With a go.work the modules are loaded in workspace mode, each
// against the others' code in the tree.
//
// Exit status: 0 when the listing matches (or was written), 1 when it does
// not, 2 when the packages could not be loaded or do not type-check, with
// their errors printed.
package main
