package consumer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

func TestNextNumber(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		prior []int // the numbers of the recorded attempts
		want  int
	}{
		{"none recorded", nil, 1},
		{"numbered in order", []int{1, 2, 3}, 4},
		{"the transport counted more", []int{2, 5}, 6},
		{"numbers lag the count", []int{1, 1, 1}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var prior []idem.Attempt
			for _, n := range tt.prior {
				prior = append(prior, idem.Attempt{Number: n})
			}
			if got := nextNumber(prior); got != tt.want {
				t.Errorf("nextNumber(%v) = %d, want %d", tt.prior, got, tt.want)
			}
		})
	}
}

func TestOrderPolicyString(t *testing.T) {
	t.Parallel()
	for p, want := range map[OrderPolicy]string{Park: "park", LetThrough: "let-through", 9: "OrderPolicy(9)"} {
		if got := p.String(); got != want {
			t.Errorf("%d: %q, want %q", int(p), got, want)
		}
	}
}

// A stale head's key-mates go back to the transport in the order of their
// messages: a later delivery of a message in the place of its first.
func TestInFirstPlaces(t *testing.T) {
	t.Parallel()
	// An entry is named by its message ID, de-duplicated by it as by
	// default; "~e2" has no ID and the dedup key e2 (read from its
	// payload); "" has neither, its dedup key could not be derived.
	ent := func(name string) *entry {
		switch {
		case name == "":
			return &entry{msg: idem.Message{Key: "k"}, dedupErr: errors.New("dedup key: empty")}
		case strings.HasPrefix(name, "~"):
			return &entry{msg: idem.Message{Key: "k"}, dedup: name[1:]}
		}
		return &entry{msg: idem.Message{ID: name, Key: "k"}, dedup: name}
	}
	ids := func(es []*entry) []string {
		var out []string
		for _, e := range es {
			switch {
			case e.msg.ID == "" && e.dedup != "":
				out = append(out, "~"+e.dedup)
			default:
				out = append(out, e.msg.ID)
			}
		}
		return out
	}
	for _, tc := range []struct {
		head   string
		behind []string
		want   []string
	}{
		{"m1", nil, nil},
		{"m1", []string{"m2", "m3"}, []string{"m2", "m3"}},
		// m2's AckWait ended too: its later delivery goes back before m3.
		{"m1", []string{"m2", "m3", "m2"}, []string{"m2", "m2", "m3"}},
		{"m1", []string{"m2", "m3", "m4", "m3", "m2"}, []string{"m2", "m2", "m3", "m3", "m4"}},
		// Messages with neither an ID nor a dedup key are not told apart:
		// each keeps its place.
		{"m1", []string{"m2", "", "m3", "m2", ""}, []string{"m2", "m2", "", "m3", ""}},
		// Messages without an ID are told apart by their dedup keys.
		{"~e1", []string{"~e2", "~e3", "~e2"}, []string{"~e2", "~e2", "~e3"}},
		// The head's later delivery goes back first.
		{"~e1", []string{"~e2", "~e1", "~e3"}, []string{"~e1", "~e2", "~e3"}},
	} {
		head := tc.head
		var behind []*entry
		for _, id := range tc.behind {
			behind = append(behind, ent(id))
		}
		got := inFirstPlaces(ent(head), behind)
		if g := ids(got); fmt.Sprint(g) != fmt.Sprint(tc.want) {
			t.Errorf("inFirstPlaces(%s, %v) = %v, want %v", head, tc.behind, g, tc.want)
		}
		for i := range got {
			for j := i + 1; j < len(got); j++ {
				if got[i] == got[j] {
					t.Errorf("inFirstPlaces(%s, %v): an entry twice", head, tc.behind)
				}
			}
		}
	}
}
