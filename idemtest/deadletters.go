package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TestDeadLetters runs the conformance suite of idem.DeadLetters as
// subtests of t: Add keeps the message (bytes, headers, topic, key), every
// attempt and the failure times exactly, and starts the letter dead with a
// "dead-lettered" event; Get of an unknown ID is idem.ErrNotFound; List
// applies every filter field and returns the most recent failure first;
// Resolve moves a dead letter to redriven or discarded and appends its
// event, and refuses, changing nothing, a letter that is no longer dead
// (idem.ErrInvalidTransition) or unknown (idem.ErrNotFound); Stats counts
// each consumer's dead letters and gives the oldest first failure.
//
// newDeadLetters is called once per subtest, from that subtest's
// goroutine, and must return a fresh, empty store that reads the time from
// clock. It should register any cleanup with t.Cleanup. Subtests run in
// parallel. The order of Stats is not checked.
func TestDeadLetters(t *testing.T, newDeadLetters func(t *testing.T, clock idem.Clock) idem.DeadLetters) {
	t.Helper()
	for _, tc := range deadLetterTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(Start)
			d := newDeadLetters(t, clock)
			if d == nil {
				t.Fatal("newDeadLetters returned a nil DeadLetters")
			}
			tc.run(t, &letterEnv{t: t, ctx: t.Context(), clock: clock, d: d})
		})
	}
}

var deadLetterTests = []struct {
	name string
	run  func(t *testing.T, e *letterEnv)
}{
	{"AddGet", testLetterAddGet},
	{"GetUnknown", testLetterGetUnknown},
	{"List", testLetterList},
	{"Resolve", testLetterResolve},
	{"ResolveRefused", testLetterResolveRefused},
	{"Stats", testLetterStats},
	{"Invalid", testLetterInvalid},
}

type letterEnv struct {
	t     *testing.T
	ctx   context.Context
	clock *idemmem.Clock
	d     idem.DeadLetters
}

// letter returns a dead letter of consumer with attempts failures, the
// first failing at first and the others a second apart each.
func letter(consumer string, n int, class idem.DeadLetterClass, first time.Time, attempts int) idem.DeadLetter {
	m := event(n)
	m.Headers["Idem-Fault"] = "fail-times=100"
	dl := idem.DeadLetter{Consumer: consumer, Message: m, Class: class}
	errClass := idem.ClassTransient
	if class == idem.DeadPermanent {
		errClass = idem.ClassPermanent
	}
	for i := range attempts {
		dl.Attempts = append(dl.Attempts, idem.Attempt{
			Number: i + 1,
			At:     first.Add(time.Duration(i) * time.Second),
			Class:  errClass,
			Error:  fmt.Sprintf("attempt %d of %s: connection refused", i+1, m.ID),
		})
	}
	dl.FirstFailedAt = dl.Attempts[0].At
	dl.LastFailedAt = dl.Attempts[len(dl.Attempts)-1].At
	return dl
}

func (e *letterEnv) add(dl idem.DeadLetter) string {
	e.t.Helper()
	id, err := e.d.Add(e.ctx, dl)
	if err != nil {
		e.t.Fatalf("Add(%q of %s): %v", dl.Message.ID, dl.Consumer, err)
	}
	if id == "" {
		e.t.Fatalf("Add(%q of %s) returned an empty ID", dl.Message.ID, dl.Consumer)
	}
	return id
}

func (e *letterEnv) get(id string) idem.DeadLetter {
	e.t.Helper()
	dl, err := e.d.Get(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Get(%q): %v", id, err)
	}
	return dl
}

// letterDiff describes how got differs from want in what the caller of Add
// gave, or returns "".
func letterDiff(got, want idem.DeadLetter) string {
	var diffs []string
	if got.Consumer != want.Consumer {
		diffs = append(diffs, fmt.Sprintf("Consumer = %q, want %q", got.Consumer, want.Consumer))
	}
	if d := messageDiff(got.Message, want.Message, true); d != "" {
		diffs = append(diffs, "Message: "+d)
	}
	if got.Class != want.Class {
		diffs = append(diffs, fmt.Sprintf("Class = %q, want %q", got.Class, want.Class))
	}
	if d := attemptsDiff(got.Attempts, want.Attempts); d != "" {
		diffs = append(diffs, d)
	}
	if !got.FirstFailedAt.Equal(want.FirstFailedAt) {
		diffs = append(diffs, fmt.Sprintf("FirstFailedAt = %v, want %v", got.FirstFailedAt, want.FirstFailedAt))
	}
	if !got.LastFailedAt.Equal(want.LastFailedAt) {
		diffs = append(diffs, fmt.Sprintf("LastFailedAt = %v, want %v", got.LastFailedAt, want.LastFailedAt))
	}
	return joinLines(diffs)
}

func attemptsDiff(got, want []idem.Attempt) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d attempts, want %d: %+v", len(got), len(want), got)
	}
	var diffs []string
	for i := range got {
		g, w := got[i], want[i]
		if g.Number != w.Number || !g.At.Equal(w.At) || g.Class != w.Class || g.Error != w.Error {
			diffs = append(diffs, fmt.Sprintf("attempt %d = %+v, want %+v", i, g, w))
		}
	}
	return joinLines(diffs)
}

func eventDiff(got, want idem.LetterEvent) string {
	if !got.At.Equal(want.At) || got.Actor != want.Actor || got.Action != want.Action || got.Reason != want.Reason || got.State != want.State {
		return fmt.Sprintf("event = %+v, want %+v", got, want)
	}
	return ""
}

func testLetterAddGet(t *testing.T, e *letterEnv) {
	want := letter("settlement", 1, idem.DeadExhausted, Start.Add(-time.Hour), 10)
	e.clock.Advance(time.Second)
	addedAt := e.clock.Now()
	id := e.add(want)
	e.clock.Advance(time.Second)
	got := e.get(id)
	if got.ID != id {
		t.Errorf("ID = %q, want %q", got.ID, id)
	}
	if d := letterDiff(got, want); d != "" {
		t.Errorf("Get(%q) differs from what was added:\n\t%s", id, d)
	}
	if got.State != idem.LetterDead {
		t.Errorf("State = %q, want %q", got.State, idem.LetterDead)
	}
	if got.LastError() != want.LastError() {
		t.Errorf("LastError = %q, want %q", got.LastError(), want.LastError())
	}
	if len(got.History) != 1 {
		t.Fatalf("History = %+v, want one event", got.History)
	}
	if h := got.History[0]; h.Action != "dead-lettered" || h.State != idem.LetterDead || !h.At.Equal(addedAt) {
		t.Errorf("History[0] = %+v, want action dead-lettered, state dead, at %v", h, addedAt)
	}

	// Another letter for the same message gets another ID.
	if id2 := e.add(want); id2 == id {
		t.Errorf("two Adds returned the same ID %q", id)
	}

	// What Get returns is the caller's copy.
	got.Message.Payload[0] = '['
	got.Message.Headers["Idem-Fault"] = "changed"
	got.Attempts[0].Error = "changed"
	if d := letterDiff(e.get(id), want); d != "" {
		t.Errorf("changing what Get returned changed the letter:\n\t%s", d)
	}
}

func testLetterGetUnknown(t *testing.T, e *letterEnv) {
	e.add(letter("settlement", 1, idem.DeadPermanent, Start, 1))
	if dl, err := e.d.Get(e.ctx, "no-such-letter"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get(unknown) = %+v, %v; want idem.ErrNotFound", dl, err)
	}
}

func testLetterList(t *testing.T, e *letterEnv) {
	// Letters by consumer, class and last failure (minutes after Start).
	type spec struct {
		consumer string
		class    idem.DeadLetterClass
		minute   int
	}
	specs := []spec{
		{"a", idem.DeadPermanent, 1},
		{"a", idem.DeadExhausted, 5},
		{"b", idem.DeadPermanent, 3},
		{"b", idem.DeadExhausted, 2},
		{"a", idem.DeadExhausted, 4},
		{"c", idem.DeadPermanent, 6},
	}
	names := make(map[string]string) // ID -> "a1", "a5", ...
	idOf := make(map[string]string)
	for i, s := range specs {
		dl := letter(s.consumer, i, s.class, Start.Add(time.Duration(s.minute)*time.Minute-2*time.Second), 3)
		id := e.add(dl)
		name := fmt.Sprintf("%s%d", s.consumer, s.minute)
		names[id], idOf[name] = name, id
	}
	// b3 is re-driven and c6 discarded: List keeps them, in their states.
	e.resolve(idOf["b3"], idem.LetterRedriven)
	e.resolve(idOf["c6"], idem.LetterDiscarded)

	at := func(minute int) time.Time { return Start.Add(time.Duration(minute) * time.Minute) }
	for _, tc := range []struct {
		name string
		f    idem.DeadLetterFilter
		want string
	}{
		{"everything", idem.DeadLetterFilter{}, "c6 a5 a4 b3 b2 a1"},
		{"consumer", idem.DeadLetterFilter{Consumer: "a"}, "a5 a4 a1"},
		{"unknown consumer", idem.DeadLetterFilter{Consumer: "z"}, ""},
		{"class permanent", idem.DeadLetterFilter{Class: idem.DeadPermanent}, "c6 b3 a1"},
		{"class exhausted", idem.DeadLetterFilter{Class: idem.DeadExhausted}, "a5 a4 b2"},
		{"state dead", idem.DeadLetterFilter{State: idem.LetterDead}, "a5 a4 b2 a1"},
		{"state redriven", idem.DeadLetterFilter{State: idem.LetterRedriven}, "b3"},
		{"state discarded", idem.DeadLetterFilter{State: idem.LetterDiscarded}, "c6"},
		{"since, inclusive", idem.DeadLetterFilter{Since: at(4)}, "c6 a5 a4"},
		{"since, between", idem.DeadLetterFilter{Since: at(4).Add(time.Millisecond)}, "c6 a5"},
		{"limit", idem.DeadLetterFilter{Limit: 2}, "c6 a5"},
		{"all fields", idem.DeadLetterFilter{Consumer: "a", Class: idem.DeadExhausted, State: idem.LetterDead, Since: at(2), Limit: 1}, "a5"},
		{"consumer and class", idem.DeadLetterFilter{Consumer: "b", Class: idem.DeadPermanent}, "b3"},
	} {
		got, err := e.d.List(e.ctx, tc.f)
		if err != nil {
			t.Errorf("List(%s): %v", tc.name, err)
			continue
		}
		var gotNames []string
		for _, dl := range got {
			n, ok := names[dl.ID]
			if !ok {
				n = "unknown ID " + dl.ID
			}
			gotNames = append(gotNames, n)
		}
		if g := strings.Join(gotNames, " "); g != tc.want {
			t.Errorf("List(%s: %+v) = [%s], want [%s]", tc.name, tc.f, g, tc.want)
		}
	}

	// List returns whole letters.
	got, err := e.d.List(e.ctx, idem.DeadLetterFilter{Consumer: "b", State: idem.LetterDead})
	if err != nil || len(got) != 1 {
		t.Fatalf("List(consumer b, dead) = %d letters, %v; want 1", len(got), err)
	}
	if d := letterDiff(got[0], e.get(idOf["b2"])); d != "" || got[0].State != idem.LetterDead || len(got[0].History) != 1 {
		t.Errorf("List's letter differs from Get's:\n\t%s\n\tgot %+v", d, got[0])
	}
}

// resolve resolves id to state, and fails the test if it cannot.
func (e *letterEnv) resolve(id string, to idem.LetterState) idem.DeadLetter {
	e.t.Helper()
	dl, err := e.d.Resolve(e.ctx, id, to, idem.LetterEvent{At: e.clock.Now(), Actor: "ops", Action: "test", Reason: "test"})
	if err != nil {
		e.t.Fatalf("Resolve(%q, %s): %v", id, to, err)
	}
	return dl
}

func testLetterResolve(t *testing.T, e *letterEnv) {
	for _, to := range []idem.LetterState{idem.LetterRedriven, idem.LetterDiscarded} {
		added := letter("settlement", 1, idem.DeadExhausted, Start, 3)
		id := e.add(added)
		first := e.get(id).History
		e.clock.Advance(time.Minute)
		ev := idem.LetterEvent{At: e.clock.Now(), Actor: "alice@example.com", Action: "resolved by the suite", Reason: "the fault is gone (" + string(to) + ")"}
		got, err := e.d.Resolve(e.ctx, id, to, ev)
		if err != nil {
			t.Fatalf("Resolve(%q, %s): %v", id, to, err)
		}
		wantEv := ev
		wantEv.State = to
		for what, dl := range map[string]idem.DeadLetter{"Resolve": got, "Get after Resolve": e.get(id)} {
			if dl.ID != id || dl.State != to {
				t.Errorf("%s: ID %q, State %q; want %q, %q", what, dl.ID, dl.State, id, to)
			}
			if d := letterDiff(dl, added); d != "" {
				t.Errorf("%s changed what was added:\n\t%s", what, d)
			}
			if len(dl.History) != len(first)+1 {
				t.Errorf("%s: History = %+v, want the first event and the new one", what, dl.History)
				continue
			}
			if d := eventDiff(dl.History[0], first[0]); d != "" {
				t.Errorf("%s: the first event changed: %s", what, d)
			}
			if d := eventDiff(dl.History[1], wantEv); d != "" {
				t.Errorf("%s: the appended %s", what, d)
			}
		}
	}
}

func testLetterResolveRefused(t *testing.T, e *letterEnv) {
	id := e.add(letter("settlement", 1, idem.DeadPermanent, Start, 1))
	e.resolve(id, idem.LetterRedriven)
	before := e.get(id)
	ev := idem.LetterEvent{At: e.clock.Now(), Actor: "bob", Action: "discarded", Reason: "again"}
	for _, to := range []idem.LetterState{idem.LetterDiscarded, idem.LetterRedriven, idem.LetterDead} {
		if _, err := e.d.Resolve(e.ctx, id, to, ev); !errors.Is(err, idem.ErrInvalidTransition) {
			t.Errorf("Resolve(%s letter, %s) = %v, want idem.ErrInvalidTransition", before.State, to, err)
		}
	}
	after := e.get(id)
	if after.State != before.State || len(after.History) != len(before.History) {
		t.Errorf("a refused Resolve changed the letter: state %q with %d events, was %q with %d",
			after.State, len(after.History), before.State, len(before.History))
	}

	dead := e.add(letter("settlement", 2, idem.DeadPermanent, Start, 1))
	if _, err := e.d.Resolve(e.ctx, dead, idem.LetterDead, ev); !errors.Is(err, idem.ErrInvalidTransition) {
		t.Errorf("Resolve(dead letter, dead) = %v, want idem.ErrInvalidTransition", err)
	}
	if _, err := e.d.Resolve(e.ctx, dead, "lost", ev); err == nil {
		t.Error(`Resolve(dead letter, "lost") = nil, want an error`)
	}
	if got := e.get(dead); got.State != idem.LetterDead || len(got.History) != 1 {
		t.Errorf("a refused Resolve changed a dead letter: state %q with %d events", got.State, len(got.History))
	}

	if _, err := e.d.Resolve(e.ctx, "no-such-letter", idem.LetterDiscarded, ev); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Resolve(unknown) = %v, want idem.ErrNotFound", err)
	}
}

func testLetterStats(t *testing.T, e *letterEnv) {
	if st, err := e.d.Stats(e.ctx); err != nil || len(st) != 0 {
		t.Errorf("Stats of an empty store = %+v, %v; want none", st, err)
	}
	// a: two dead, and an older one discarded, which does not count.
	old := e.add(letter("a", 1, idem.DeadPermanent, Start.Add(-time.Hour), 1))
	e.add(letter("a", 2, idem.DeadExhausted, Start.Add(-30*time.Minute), 5))
	e.add(letter("a", 3, idem.DeadPermanent, Start.Add(-10*time.Minute), 1))
	e.resolve(old, idem.LetterDiscarded)
	// b: one dead.
	e.add(letter("b", 4, idem.DeadExhausted, Start.Add(-5*time.Minute), 3))
	// c: none dead.
	gone := e.add(letter("c", 5, idem.DeadPermanent, Start.Add(-2*time.Hour), 1))
	e.resolve(gone, idem.LetterRedriven)

	st, err := e.d.Stats(e.ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	slices.SortFunc(st, func(x, y idem.DeadLetterStats) int { return strings.Compare(x.Consumer, y.Consumer) })
	want := []idem.DeadLetterStats{
		{Consumer: "a", Count: 2, Oldest: Start.Add(-30 * time.Minute)},
		{Consumer: "b", Count: 1, Oldest: Start.Add(-5 * time.Minute)},
	}
	ok := len(st) == len(want)
	for i := 0; ok && i < len(st); i++ {
		ok = st[i].Consumer == want[i].Consumer && st[i].Count == want[i].Count && st[i].Oldest.Equal(want[i].Oldest)
	}
	if !ok {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
}

func testLetterInvalid(t *testing.T, e *letterEnv) {
	valid := letter("settlement", 1, idem.DeadPermanent, Start, 1)
	noConsumer, noID, noTopic, badClass := valid, valid, valid, valid
	noConsumer.Consumer = ""
	noID.Message.ID = ""
	noTopic.Message.Topic = ""
	badClass.Class = "tired"
	for name, dl := range map[string]idem.DeadLetter{
		"no consumer":             noConsumer,
		"a message with no ID":    noID,
		"a message with no topic": noTopic,
		"an unknown class":        badClass,
	} {
		if id, err := e.d.Add(e.ctx, dl); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Add(letter with %s) = %q, %v; want idem.ErrInvalidArgument", name, id, err)
		}
	}
	if got, err := e.d.List(e.ctx, idem.DeadLetterFilter{}); err != nil || len(got) != 0 {
		t.Errorf("List after refused Adds = %d letters, %v; want none", len(got), err)
	}
}
