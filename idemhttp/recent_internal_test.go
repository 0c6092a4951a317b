package idemhttp

import (
	"fmt"
	"testing"

	"github.com/idem-go/idem"
)

func TestRecentKeysForgetsTheOldest(t *testing.T) {
	r := newRecentKeys(3)
	k := func(i int) waitKey { return waitKey{"s", idem.Key(fmt.Sprint("k", i))} }
	for i := range 3 {
		r.add(k(i))
	}
	r.add(k(1)) // known already: nothing moves
	for i := range 3 {
		if !r.has(k(i)) {
			t.Fatalf("k%d forgotten while there was room", i)
		}
	}
	r.add(k(3))
	r.add(k(4))
	for i, want := range []bool{false, false, true, true, true} {
		if r.has(k(i)) != want {
			t.Errorf("after two more keys, has(k%d) = %v, want %v", i, !want, want)
		}
	}
	if len(r.set) != 3 || len(r.ring) != 3 {
		t.Errorf("%d remembered in a ring of %d, want 3", len(r.set), len(r.ring))
	}
	var none *recentKeys = newRecentKeys(-1)
	none.add(k(0))
	if none.has(k(0)) {
		t.Error("a disabled recentKeys remembered a key")
	}
}
