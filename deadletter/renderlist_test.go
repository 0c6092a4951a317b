package deadletter_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
)

// RenderList says so when there is nothing to show, and otherwise prints a
// header and a row per letter, with the last error whole up to 60
// characters and cut to 60, the last an ellipsis, beyond.
func TestRenderListRowsAndErrorWidth(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	if err := deadletter.RenderList(&b, nil); err != nil || b.String() != "no dead letters\n" {
		t.Fatalf("RenderList(none) = %q, %v; want %q", b.String(), err, "no dead letters\n")
	}

	exact := strings.Repeat("e", 60)
	long := strings.Repeat("l", 61)
	withError := func(id, e string) idem.DeadLetter {
		dl := renderLetter(nil)
		dl.ID, dl.Attempts = id, []idem.Attempt{{Number: 1, At: t0, Class: idem.ClassPermanent, Error: e}}
		return dl
	}
	b.Reset()
	if err := deadletter.RenderList(&b, []idem.DeadLetter{withError("dl-1", exact), withError("dl-2", long)}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("RenderList of two letters:\n%s\nwant a header and two rows", b.String())
	}
	if !strings.HasPrefix(lines[1], "dl-1 ") || !strings.HasSuffix(lines[1], " "+exact) {
		t.Errorf("row of a 60-character error: %q, want it to end with the whole error", lines[1])
	}
	if want := " " + long[:59] + "…"; !strings.HasPrefix(lines[2], "dl-2 ") || !strings.HasSuffix(lines[2], want) {
		t.Errorf("row of a 61-character error: %q, want it to end with %q", lines[2], want)
	}
}
