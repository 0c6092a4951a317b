package bench

import "testing"

// TestPairedRatio checks that the ratio is taken within each round, then
// the median of those: with the machine slowing from round to round, the
// median rounds of the two sides (1100 and 1050 in "drift") were not
// measured together and would give 1.05.
func TestPairedRatio(t *testing.T) {
	rates := func(v ...float64) []Result {
		rs := make([]Result, len(v))
		for i, r := range v {
			rs[i].PerSecond = r
		}
		return rs
	}
	cases := []struct {
		name    string
		mw, min []Result
		want    float64
	}{
		{"drift", rates(2000, 1000, 1100), rates(2100, 1050, 1000), 1000.0 / 1050},
		{"one slow round", rates(900, 300, 900), rates(1000, 1000, 1000), 0.9},
		{"even", rates(800, 1000), rates(1000, 1000), 0.9},
		{"one", rates(500), rates(1000), 0.5},
	}
	for _, c := range cases {
		if got := pairedRatio(c.mw, c.min); got != c.want {
			t.Errorf("%s: pairedRatio = %v, want %v", c.name, got, c.want)
		}
	}
}
