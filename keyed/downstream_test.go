package keyed_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// A downstream key is the request's scope and client key (its seed) and
// the call's name, part by part: each list of names gets its own key, and
// the derivation does not change unnoticed (a key that changes between two
// versions makes an execution resumed on the newer one call its services
// again). It last changed before the first release, to derive from the
// seed, which sealing the keys does not change.
func TestDownstreamKey(t *testing.T) {
	t.Parallel()
	ex := keyed.Execution{Scope: "tenant-a", Key: "k-1", Token: 7}
	if got, want := ex.DownstreamKey("charge"), "idg1_AETAZBPcKwA-TIgg7anvuoD-qfKge3b65DLSga0o3qo"; got != want {
		t.Fatalf("DownstreamKey(charge) = %q; want %q, the key earlier versions derived", got, want)
	}
	// A scope far longer than its one-character key derives as any other.
	long := keyed.Execution{Scope: idem.Scope("tenant-with-a-long-name/" + strings.Repeat("x", 50)), Key: "k"}
	if got, want := long.DownstreamKey("charge"), "idg1_613FksbnYNpvJglhUEZGlvlyZYNFfmXn8v7xww1YB3w"; got != want {
		t.Fatalf("DownstreamKey(charge) for a scope of 74 bytes and the key k = %q; want %q, the key earlier versions derived", got, want)
	}
	other := ex
	other.Token, other.TookOver = 8, true
	if ex.DownstreamKey("charge") != other.DownstreamKey("charge") {
		t.Fatal("another execution of the same key derives another key")
	}
	seen := map[string][]string{}
	for _, c := range [][]string{{"charge"}, {"refund"}, {"a", "bc"}, {"ab", "c"}, {"abc"}, {"a", "b", "c"}, {""}, {"", ""}} {
		k := ex.DownstreamKey(c[0], c[1:]...)
		if prev, dup := seen[k]; dup {
			t.Fatalf("%q and %q derive one key, %s", prev, c, k)
		}
		seen[k] = c
	}
	for _, e := range []keyed.Execution{{Scope: "tenant-b", Key: "k-1"}, {Scope: "tenant-a", Key: "k-2"}, {Scope: "tenant-ak", Key: "-1"}} {
		if e.DownstreamKey("charge") == ex.DownstreamKey("charge") {
			t.Fatalf("%s/%s derives the key of tenant-a/k-1", e.Scope, e.Key)
		}
	}
	if _, ok := keyed.DownstreamKey(t.Context(), "charge"); ok {
		t.Fatal("DownstreamKey outside an execution: ok; want false")
	}
}
