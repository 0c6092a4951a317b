package consumer

import (
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
