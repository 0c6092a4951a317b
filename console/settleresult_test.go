package console_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/keyed"
)

// A settle refused for the key's state changed nothing and needs no entry
// in the history; one that failed otherwise (the store failed while
// keeping the answer, which may have been kept) gets one saying that its
// result is unknown.
func TestSettleResult(t *testing.T) {
	t.Parallel()
	answer := console.FailedAnswer()
	for _, c := range []struct {
		err    error
		record bool
		want   string
	}{
		{nil, true, "settled (status 409)"},
		{fmt.Errorf("%w: it is completed", keyed.ErrNotStopped), false, ""},
		{fmt.Errorf("%w: its lease ends later", keyed.ErrBeingFinished), false, ""},
		{fmt.Errorf("%w: it stopped at \"charging-grpc\"", keyed.ErrOtherPoint), false, ""},
		{fmt.Errorf("no key: %w", idem.ErrNotFound), false, ""},
		{&idem.ArgumentError{Field: "key", Reason: "bad"}, false, ""},
		{fmt.Errorf("keeping the settled answer: %w", errors.New("commit: connection reset")), true, "result unknown"},
		{context.DeadlineExceeded, true, "result unknown"},
	} {
		got, record := console.SettleResult(answer, c.err)
		if record != c.record || !strings.Contains(got, c.want) {
			t.Errorf("SettleResult(%v) = %q, %v; want %v and %q", c.err, got, record, c.record, c.want)
		}
	}
}
