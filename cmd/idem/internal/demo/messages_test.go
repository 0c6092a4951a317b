package demo_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo"
	"github.com/idem-go/idem/idemsqlite"
)

var (
	runs = flag.Int("demo.runs", 1, "how many times TestRunMessages plays the message demo, every run's figures "+
		"compared with "+figuresFile+" (20 checks what the lab promises)")
	update = flag.Bool("demo.update", false, "rewrite "+figuresFile+" with the figures TestRunMessages' first run finds")
)

// figuresFile holds every figure and verdict of the message demo, as
// figures writes them: the same on every run, on every machine, since the
// lab's time is its own clock and its jitter a seeded source.
const figuresFile = "testdata/messages.figures"

// runMessages plays the message demo with opts, failing the test if it
// could not run.
func runMessages(t *testing.T, opts *demo.MessagesOptions) (*demo.MessagesReport, string) {
	t.Helper()
	// Seconds at most, even under the race detector on a loaded machine:
	// the bound is for a hang.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o := *opts
	o.Out = &out
	rep, err := demo.RunMessages(ctx, &o)
	if err != nil {
		t.Fatalf("RunMessages: %v\noutput:\n%s", err, out.String())
	}
	return rep, out.String()
}

// Each unsafe row fails the way it says, each protected row holds, and the
// figures are the ones the scenarios' plans make; and they are the same on
// every run, since the lab's figures come from its own clock and counts:
// every run's are compared with those recorded in figuresFile (on another
// day, another machine), so one run in CI checks what two runs side by
// side would, and more. -demo.runs 20 is the lab's promise. The README
// shows the tables a run prints.
func TestRunMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	began := time.Now()
	rep, out := runMessages(t, &demo.MessagesOptions{Dir: dir})
	t.Logf("run 1: %v; output:\n%s", time.Since(began).Round(time.Millisecond), out)
	if !rep.OK() {
		t.Errorf("OK() = false, want true")
	}
	checkMessagesReport(t, rep, out, dir)
	checkREADME(t, out)

	got := figures(rep)
	if *update {
		if err := os.WriteFile(figuresFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(figuresFile)
	if err != nil {
		t.Fatalf("reading the recorded figures: %v (-demo.update records them)", err)
	}
	if got != string(want) {
		t.Fatalf("the figures differ from those recorded in %s; the lab's figures are the same on every run, so this is "+
			"a change of the lab or of what it runs (after a deliberate one, -demo.update records the new figures, and "+
			"the README's tables follow):\n%s\nrecorded:\n%s", figuresFile, got, want)
	}
	for i := 2; i <= *runs; i++ {
		began := time.Now()
		rep, out := runMessages(t, &demo.MessagesOptions{})
		t.Logf("run %d: %v", i, time.Since(began).Round(time.Millisecond))
		if !rep.OK() {
			t.Fatalf("run %d: OK() = false; output:\n%s", i, out)
		}
		if got := figures(rep); got != string(want) {
			t.Fatalf("run %d differs from the recorded figures:\n%s\nrecorded:\n%s", i, got, want)
		}
	}
}

// checkREADME checks that the README's lab section shows the tables out
// holds, row for row, so that what it says each row proves is what the
// command prints.
func checkREADME(t *testing.T, out string) {
	t.Helper()
	readme := findREADME(t)
	lines := make(map[string]bool)
	for line := range strings.Lines(readme) {
		lines[strings.TrimSuffix(line, "\n")] = true
	}
	for line := range strings.Lines(out) {
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, "run  ") || strings.HasPrefix(line, "unsafe  ") || strings.HasPrefix(line, "protected  ") {
			if !lines[line] {
				t.Errorf("README.md does not show the table row\n%s", line)
			}
		}
	}
}

// findREADME reads the repository's README.md, in the first directory
// above this one that holds go.work.
func findREADME(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			b, err := os.ReadFile(filepath.Join(dir, "README.md"))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.work above the test's directory: the README is the repository's")
		}
		dir = parent
	}
}

// checkMessagesReport checks one run's report and output, its file kept
// in dir.
func checkMessagesReport(t *testing.T, rep *demo.MessagesReport, out, dir string) {
	t.Helper()

	// Redelivery: 20 events, 5 acknowledgements lost and one kill, so 26
	// deliveries; without an inbox each of them added.
	if len(rep.Redelivery) != 2 {
		t.Fatalf("%d redelivery rows, want 2", len(rep.Redelivery))
	}
	u, p := rep.Redelivery[0], rep.Redelivery[1]
	if u.Mode != demo.ModeUnsafe || u.Events != 20 || u.Deliveries != 26 || u.Applied != 26 || u.Total != 26*12_000 || u.ShouldBe != 20*12_000 {
		t.Errorf("redelivery, unsafe: %+v; want 26 deliveries of 20 events, each added", u)
	}
	if v := u.Verdict(); v != "COUNTED TWICE (+72,000 KRW)" {
		t.Errorf("redelivery, unsafe: verdict %q", v)
	}
	if p.Mode != demo.ModeProtected || p.Deliveries != 26 || p.Applied != 20 || p.Total != p.ShouldBe || p.Verdict() != "exactly once" {
		t.Errorf("redelivery, protected: %+v, %q; want 26 deliveries, 20 applied, exactly once", p, p.Verdict())
	}

	// Poison: the naive consumer retried for the whole watch, every
	// second, and nothing behind it moved; idem's dead-lettered it after
	// 10 attempts and applied the rest without waiting.
	if len(rep.Poison) != 2 {
		t.Fatalf("%d poison rows, want 2", len(rep.Poison))
	}
	pu, pp := rep.Poison[0], rep.Poison[1]
	if pu.Applied != 0 || pu.Healthy != 20 || pu.PoisonAttempts != 121 || pu.LongestWait != 2*time.Minute || pu.DeadLetter != "" || !pu.Blocked() {
		t.Errorf("poison, unsafe: %+v; want 0 of 20 applied, 121 attempts in 2m, no dead letter", pu)
	}
	if !strings.HasPrefix(pu.Verdict(), "BLOCKED: 20 healthy") {
		t.Errorf("poison, unsafe: verdict %q", pu.Verdict())
	}
	if pp.Applied != 20 || pp.LongestWait != 0 || pp.PoisonAttempts != 10 || pp.DeadLetter == "" || pp.Blocked() {
		t.Errorf("poison, protected: %+v; want 20 applied at once, a dead letter after 10 attempts", pp)
	}
	dl := rep.Letter
	if dl.ID != pp.DeadLetter || dl.Class != idem.DeadExhausted || len(dl.Attempts) != 10 || !strings.Contains(dl.LastError(), `"XTS"`) {
		t.Errorf("poison's dead letter: %s, class %s, %d attempts, last error %q; want it exhausted after 10, with the reason",
			dl.ID, dl.Class, len(dl.Attempts), dl.LastError())
	}
	for i := 1; i < len(dl.Attempts); i++ {
		if dl.Attempts[i].At.Before(dl.Attempts[i-1].At) {
			t.Errorf("attempt %d at %v, before attempt %d", i+1, dl.Attempts[i].At, i)
		}
	}
	// The letter is in the kept file, where `idem dlq show` reads it.
	db, err := idemsqlite.Open(filepath.Join(dir, "messages.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	letters, err := idemsqlite.NewDeadLetters(t.Context(), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := letters.Get(t.Context(), pp.DeadLetter); err != nil || got.Message.ID != dl.Message.ID || got.State != idem.LetterDead {
		t.Errorf("the kept file's letter %s: %+v, %v", pp.DeadLetter, got, err)
	}
	if rep.DB != filepath.Join(dir, "messages.db") {
		t.Errorf("DB = %q, want the file in %s", rep.DB, dir)
	}

	// Storm: without jitter the 100 retries land in one window, over the
	// capacity, and knock the service over; with full jitter they stay
	// under it.
	if len(rep.Storm) != 2 {
		t.Fatalf("%d storm rows, want 2", len(rep.Storm))
	}
	su, sp := rep.Storm[0], rep.Storm[1]
	if su.Peak != 100 || su.Capacity != demo.DefaultCapacity || su.FellOver == 0 || su.Held() {
		t.Errorf("storm, no jitter: %+v; want a peak of 100 per 100 ms, over capacity, and a fall", su)
	}
	if !strings.HasPrefix(su.Verdict(), "FELL OVER AGAIN") {
		t.Errorf("storm, no jitter: verdict %q", su.Verdict())
	}
	if sp.Peak > sp.Capacity || sp.FellOver != 0 || sp.Applied != 100 || sp.Verdict() != "held" {
		t.Errorf("storm, full jitter: %+v, %q; want every event applied under capacity", sp, sp.Verdict())
	}
	for _, r := range rep.Storm {
		sum := 0
		for _, n := range r.Buckets {
			sum += n
		}
		if sum != r.Calls || r.Calls < r.Events {
			t.Errorf("storm, %s: buckets sum to %d, calls %d", r.Consumer, sum, r.Calls)
		}
	}

	// Order: without per-key order the additive consumer ends right
	// through a negative balance and "set the status" ends paid; with
	// per-key order both end right, every step in order, which is what the
	// closing says ("per-key order fixes both"); with versions the status
	// ends refunded with no order at all.
	if len(rep.Order) != 5 {
		t.Fatalf("%d order rows, want 5", len(rep.Order))
	}
	adds, sets, addsOrdered, ordered, versioned := rep.Order[0], rep.Order[1], rep.Order[2], rep.Order[3], rep.Order[4]
	if adds.FinalRight != 5 || adds.HistoryRight != 0 || adds.RefundFirst != 5 || adds.Lowest != -5_000 {
		t.Errorf("order, adds: %+v; want every total right, every history wrong, a balance of -5,000", adds)
	}
	if sets.FinalRight != 0 || sets.RefundFirst != 5 || !strings.HasPrefix(sets.Verdict(), "WRONG STATE (5 refunds undone)") {
		t.Errorf("order, sets: %+v, %q; want every refund undone", sets, sets.Verdict())
	}
	if !addsOrdered.Adds || !addsOrdered.Ordered || !addsOrdered.Right() || addsOrdered.RefundFirst != 0 || addsOrdered.Lowest != 0 {
		t.Errorf("order, adds with per-key order: %+v, %q; want right, no refund first, never below zero", addsOrdered, addsOrdered.Verdict())
	}
	if ordered.Adds || !ordered.Ordered || !ordered.Right() || ordered.RefundFirst != 0 {
		t.Errorf("order, per-key order: %+v, %q; want right, no refund first", ordered, ordered.Verdict())
	}
	if !versioned.Right() || versioned.RefundFirst != 5 {
		t.Errorf("order, versioned: %+v, %q; want right although every refund came first", versioned, versioned.Verdict())
	}

	for _, want := range []string{
		"run        consumer", "deliveries", "COUNTED TWICE", "exactly once", "BLOCKED", "dead-lettered after 10 attempts",
		"idem dlq show " + pp.DeadLetter + " --db sqlite:" + rep.DB, "/console/letters/" + pp.DeadLetter,
		"peak per 100ms", "FELL OVER AGAIN", "held", "█", "HISTORY WRONG", "WRONG STATE", "right: it keeps per-key order",
		"right: a version needs no order", "What this showed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// figures is everything a report says that must not change from run to
// run: every figure and verdict, not the dead letter's ID or the time the
// run took.
func figures(r *demo.MessagesReport) string {
	var b strings.Builder
	for _, row := range r.Redelivery {
		fmt.Fprintf(&b, "%+v %s\n", row, row.Verdict())
	}
	for _, row := range r.Poison {
		row.DeadLetter = fmt.Sprint(row.DeadLetter != "")
		fmt.Fprintf(&b, "%+v %s\n", row, row.Verdict())
	}
	for _, row := range r.Storm {
		fmt.Fprintf(&b, "%+v %s\n", row, row.Verdict())
	}
	for _, row := range r.Order {
		fmt.Fprintf(&b, "%+v %s\n", row, row.Verdict())
	}
	for _, a := range r.Letter.Attempts {
		fmt.Fprintf(&b, "attempt %d +%v %s %s\n", a.Number, a.At.Sub(r.Letter.FirstFailedAt), a.Class, a.Error)
	}
	return b.String()
}

func TestRunMessagesStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rep, err := demo.RunMessages(ctx, nil)
	if err == nil {
		t.Fatalf("RunMessages with a cancelled context: err = nil, want an error")
	}
	if rep.OK() {
		t.Errorf("OK() = true after a cancelled run")
	}
}
