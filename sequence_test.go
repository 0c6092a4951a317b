package idem_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

func TestCheckSequence(t *testing.T) {
	t.Parallel()
	const big = math.MaxUint64
	tests := []struct {
		name      string
		mark, seq uint64
		gap       idem.GapPolicy
		want      error // nil, idem.ErrDuplicate or idem.ErrSequenceGap
	}{
		{"first", 0, 1, idem.GapHold, nil},
		{"next", 4, 5, idem.GapHold, nil},
		{"at the mark", 5, 5, idem.GapHold, idem.ErrDuplicate},
		{"below the mark", 5, 2, idem.GapHold, idem.ErrDuplicate},
		{"below the mark, gaps allowed", 5, 2, idem.GapAllow, idem.ErrDuplicate},
		{"gap held", 5, 7, idem.GapHold, idem.ErrSequenceGap},
		{"gap held from nothing", 0, 2, idem.GapHold, idem.ErrSequenceGap},
		{"gap allowed", 5, 7, idem.GapAllow, nil},
		{"gap allowed from nothing", 0, 1 << 40, idem.GapAllow, nil},
		{"the last number", big - 1, big, idem.GapHold, nil},
		{"at the last number", big, big, idem.GapAllow, idem.ErrDuplicate},
		{"gap to the last number", 1, big, idem.GapHold, idem.ErrSequenceGap},
		// Past 2^63 and 2^53: a store that keeps int64 or float64 would
		// get these wrong.
		{"past 2^63", 1<<63 + 6, 1<<63 + 7, idem.GapHold, nil},
		{"past 2^53", 1<<53 + 1, 1<<53 + 1, idem.GapHold, idem.ErrDuplicate},
	}
	for _, tt := range tests {
		err := idem.CheckSequence("acct-1", tt.mark, tt.seq, tt.gap)
		switch {
		case tt.want == nil && err != nil:
			t.Errorf("%s: CheckSequence(mark %d, seq %d, %s) = %v, want nil", tt.name, tt.mark, tt.seq, tt.gap, err)
		case tt.want != nil && !errors.Is(err, tt.want):
			t.Errorf("%s: CheckSequence(mark %d, seq %d, %s) = %v, want %v", tt.name, tt.mark, tt.seq, tt.gap, err, tt.want)
		}
		var gap *idem.SequenceGapError
		if errors.As(err, &gap) && (gap.Aggregate != "acct-1" || gap.Mark != tt.mark || gap.Seq != tt.seq) {
			t.Errorf("%s: gap error %+v, want aggregate acct-1, mark %d, seq %d", tt.name, gap, tt.mark, tt.seq)
		}
		if errors.Is(err, idem.ErrDuplicate) && errors.Is(err, idem.ErrSequenceGap) {
			t.Errorf("%s: %v is both a duplicate and a gap", tt.name, err)
		}
	}
}

func TestSequenceGapError(t *testing.T) {
	t.Parallel()
	var err error = &idem.SequenceGapError{Aggregate: "acct-1", Mark: 3, Seq: 6}
	if !errors.Is(err, idem.ErrSequenceGap) {
		t.Error("a *SequenceGapError does not match ErrSequenceGap")
	}
	if errors.Is(err, idem.ErrDuplicate) || idem.IsPermanent(err) {
		t.Error("a gap must be neither a duplicate nor permanent: it is retried")
	}
	for _, want := range []string{`"acct-1"`, "got 6", "expected 4"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %s", err, want)
		}
	}
}

func TestGapPolicyString(t *testing.T) {
	t.Parallel()
	for p, want := range map[idem.GapPolicy]string{idem.GapHold: "hold", idem.GapAllow: "allow", 7: "GapPolicy(7)"} {
		if got := p.String(); got != want {
			t.Errorf("GapPolicy(%d).String() = %q, want %q", int(p), got, want)
		}
	}
	if idem.GapPolicy(0) != idem.GapHold {
		t.Error("the zero GapPolicy is not GapHold: a zero Config would not hold gaps")
	}
}

func TestCheckSequenceArgs(t *testing.T) {
	t.Parallel()
	fn := func(context.Context) error { return nil }
	if err := idem.CheckSequenceArgs("c", "a", 1, idem.GapAllow, fn); err != nil {
		t.Fatalf("valid arguments: %v", err)
	}
	for _, tt := range []struct {
		name, field   string
		consumer, agg string
		seq           uint64
		gap           idem.GapPolicy
		fn            func(context.Context) error
	}{
		{"no consumer", "consumer", "", "a", 1, idem.GapHold, fn},
		{"no aggregate", "aggregate", "c", "", 1, idem.GapHold, fn},
		{"seq 0", "seq", "c", "a", 0, idem.GapHold, fn},
		{"unknown gap policy", "gap", "c", "a", 1, idem.GapPolicy(2), fn},
		{"nil fn", "fn", "c", "a", 1, idem.GapHold, nil},
	} {
		err := idem.CheckSequenceArgs(tt.consumer, tt.agg, tt.seq, tt.gap, tt.fn)
		var ae *idem.ArgumentError
		if !errors.As(err, &ae) || ae.Field != tt.field {
			t.Errorf("%s: %v, want an *ArgumentError for %s", tt.name, err, tt.field)
		}
	}
}
