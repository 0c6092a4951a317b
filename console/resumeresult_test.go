package console_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// resumeEndsWith is KeyActions whose resume ends in err, having written
// its record as a store without transactions has it written.
type resumeEndsWith struct {
	console.KeyActions
	err error
}

func (a resumeEndsWith) ResumeRecorded(ctx context.Context, _ idem.Scope, _ idem.Key, record keyed.ResumeRecord) (bool, error) {
	if err := record(ctx, false, keyed.ResumeEnd{}); err != nil {
		return false, err
	}
	return false, a.err
}

// The history never calls failed a resume that may have finished the key
// (keyed.ErrResultUnknown: its last write got no answer); a resume that
// failed is recorded as failed.
func TestResumeAndRecordSaysWhenTheResultIsUnknown(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("keeping the answer: %w: %w", keyed.ErrResultUnknown, errors.New("commit: connection reset")), "result unknown (resume): "},
		{errors.New("the card network does not answer"), "failed: "},
	} {
		history := console.NewMemoryKeyHistory()
		ev := console.KeyEvent{Scope: "acme", Key: "k", Actor: "ops", Action: console.ActionResume, Reason: "checked"}
		finished, err := console.ResumeAndRecord(t.Context(), resumeEndsWith{err: tc.err}, history, clock, ev)
		if finished || !errors.Is(err, tc.err) {
			t.Fatalf("ResumeAndRecord ending in %v: finished %v, %v", tc.err, finished, err)
		}
		evs, err := history.KeyEvents(t.Context(), "acme", "k", console.KeyEventsQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 2 || !strings.HasPrefix(evs[0].Result, tc.want) {
			t.Fatalf("history after a resume ending in %v: %+v; want the under-way entry and one starting %q", tc.err, evs, tc.want)
		}
	}
}
