package console_test

import (
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
)

// The memory history keeps at most MemoryKeyHistoryCap entries over every
// key, dropping the oldest first; IDs keep growing past a drop, so that a
// page's cursor stays valid.
func TestMemoryKeyHistoryIsBounded(t *testing.T) {
	t.Parallel()
	h := console.NewMemoryKeyHistory()
	const n = console.MemoryKeyHistoryCap + 120
	for i := range n {
		key := "pay-1"
		if i%2 == 1 {
			key = "pay-2"
		}
		if err := h.AddKeyEvent(t.Context(), console.KeyEvent{Scope: "acme", Key: idem.Key(key), Reason: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var kept []console.KeyEvent
	for _, key := range []string{"pay-1", "pay-2"} {
		q := console.KeyEventsQuery{Limit: console.MaxKeyEventsLimit}
		for {
			evs, err := h.KeyEvents(t.Context(), "acme", idem.Key(key), q)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 0 {
				break
			}
			kept = append(kept, evs...)
			q.Before = evs[len(evs)-1].ID
		}
	}
	if len(kept) != console.MemoryKeyHistoryCap {
		t.Fatalf("%d entries kept after %d written; want the cap, %d", len(kept), n, console.MemoryKeyHistoryCap)
	}
	oldest := n
	for _, ev := range kept {
		var i int
		fmt.Sscan(ev.Reason, &i)
		if ev.ID != int64(i+1) {
			t.Fatalf("entry %q has ID %d; want %d", ev.Reason, ev.ID, i+1)
		}
		oldest = min(oldest, i)
	}
	if want := n - console.MemoryKeyHistoryCap; oldest != want {
		t.Fatalf("the oldest entry kept is %d; want %d (the oldest dropped first)", oldest, want)
	}
}
