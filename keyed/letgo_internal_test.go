package keyed

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

// letGo forgets a hold only once the key was given back or taken from
// under the caller's token: a hold under that token, or an older one (its
// lease ended by the caller's claim), is forgotten; one under a newer
// token was taken since and stays.
func TestLetGoForgetsOnlyAHoldNoNewerThanItsToken(t *testing.T) {
	t.Parallel()
	wk := keywait.Key{Key: "k"}
	for _, tc := range []struct {
		name        string
		held, given idem.Token
		wantHolding bool
	}{
		{"the caller's hold", 5, 5, false},
		{"an older hold, ended by the caller's claim", 5, 7, false},
		{"a newer hold, taken since", 7, 5, true},
		{"no hold", 0, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Completer{failures: map[keywait.Key]ResumeFailures{wk: {Count: 1, Holding: tc.held != 0, token: tc.held}}}
			c.letGo(wk, tc.given)
			f := c.failures[wk]
			if f.Holding != tc.wantHolding || (f.token != 0) != tc.wantHolding || f.Count != 1 {
				t.Errorf("a hold under %d after letGo under %d: %+v; want holding %v, its failure still counted", tc.held, tc.given, f, tc.wantHolding)
			}
		})
	}
}
