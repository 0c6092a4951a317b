package idemtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestLedger runs the conformance suite of idem.Ledger as subtests of t:
// attempts are appended and listed exactly, oldest first, and forgotten;
// a key is held back behind a letter; parked messages come back whole, in
// parking order, when the key is let go, which clears the hold and the
// parking; parking one message ID twice keeps one copy, in its first
// place; consumers, dedup keys and ordering keys are independent; empty
// names and invalid messages are refused with idem.ErrInvalidArgument.
//
// newLedger is called once per subtest, from that subtest's goroutine, and
// must return a fresh, empty ledger. It should register any cleanup with
// t.Cleanup. Subtests run in parallel. The suite calls the ledger outside
// any transaction.
func TestLedger(t *testing.T, newLedger func(t *testing.T) idem.Ledger) {
	t.Helper()
	for _, tc := range ledgerTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newLedger(t)
			if l == nil {
				t.Fatal("newLedger returned a nil Ledger")
			}
			tc.run(t, &ledgerEnv{t: t, ctx: t.Context(), l: l})
		})
	}
}

var ledgerTests = []struct {
	name string
	run  func(t *testing.T, e *ledgerEnv)
}{
	{"Attempts", testLedgerAttempts},
	{"ForgetAttempts", testLedgerForget},
	{"HoldParkLetGo", testLedgerHoldParkLetGo},
	{"ParkTwice", testLedgerParkTwice},
	{"IndependentKeys", testLedgerIndependent},
	{"Invalid", testLedgerInvalid},
	{"HeldBackKeys", testLedgerHeldBackKeys},
}

// testLedgerHeldBackKeys checks idem.BatchLedger's look-up against the holds
// HoldBack made and LetGo cleared.
func testLedgerHeldBackKeys(t *testing.T, e *ledgerEnv) {
	bl, ok := e.l.(idem.BatchLedger)
	if !ok {
		t.Skip("the ledger is not an idem.BatchLedger")
	}
	for key, letter := range map[string]string{"acct-1": "dl-1", "acct-3": "dl-3"} {
		if err := e.l.HoldBack(e.ctx, "c", key, letter); err != nil {
			t.Fatalf("HoldBack(%s): %v", key, err)
		}
	}
	if err := e.l.HoldBack(e.ctx, "other", "acct-2", "dl-9"); err != nil {
		t.Fatalf("HoldBack: %v", err)
	}
	got, err := bl.HeldBackKeys(e.ctx, "c", []string{"acct-1", "acct-2", "acct-3", "acct-4"})
	if err != nil {
		t.Fatalf("HeldBackKeys: %v", err)
	}
	if want := map[string]string{"acct-1": "dl-1", "acct-3": "dl-3"}; !maps.Equal(got, want) {
		t.Errorf("HeldBackKeys = %v, want %v (acct-2 is held for another consumer only)", got, want)
	}
	e.letGo("c", "acct-1")
	if got, err := bl.HeldBackKeys(e.ctx, "c", []string{"acct-1", "acct-3"}); err != nil || !maps.Equal(got, map[string]string{"acct-3": "dl-3"}) {
		t.Errorf("HeldBackKeys after LetGo(acct-1) = %v, %v; want only acct-3", got, err)
	}
	if got, err := bl.HeldBackKeys(e.ctx, "c", nil); err != nil || len(got) != 0 {
		t.Errorf("HeldBackKeys(no keys) = %v, %v; want none", got, err)
	}
	if _, err := bl.HeldBackKeys(e.ctx, "", []string{"acct-1"}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("HeldBackKeys with an empty consumer = %v, want idem.ErrInvalidArgument", err)
	}
}

type ledgerEnv struct {
	t   *testing.T
	ctx context.Context
	l   idem.Ledger
}

func attempt(n int) idem.Attempt {
	class := idem.ClassTransient
	if n%3 == 0 {
		class = idem.ClassPermanent
	}
	return idem.Attempt{
		Number: n,
		At:     Start.Add(time.Duration(n) * 1500 * time.Millisecond),
		Class:  class,
		Error:  fmt.Sprintf("attempt %d: upstream said \"no\"\nand more", n),
	}
}

func (e *ledgerEnv) record(consumer, key string, a idem.Attempt) []idem.Attempt {
	e.t.Helper()
	all, err := e.l.RecordAttempt(e.ctx, consumer, key, a)
	if err != nil {
		e.t.Fatalf("RecordAttempt(%q, %q, %d): %v", consumer, key, a.Number, err)
	}
	return all
}

func (e *ledgerEnv) wantAttempts(consumer, key string, want ...idem.Attempt) {
	e.t.Helper()
	got, err := e.l.Attempts(e.ctx, consumer, key)
	if err != nil {
		e.t.Fatalf("Attempts(%q, %q): %v", consumer, key, err)
	}
	if d := attemptsDiff(got, want); d != "" {
		e.t.Errorf("Attempts(%q, %q): %s", consumer, key, d)
	}
}

func (e *ledgerEnv) wantHeld(consumer, key, wantLetter string, wantHeld bool) {
	e.t.Helper()
	id, held, err := e.l.HeldBack(e.ctx, consumer, key)
	if err != nil {
		e.t.Fatalf("HeldBack(%q, %q): %v", consumer, key, err)
	}
	if held != wantHeld || (held && id != wantLetter) {
		e.t.Errorf("HeldBack(%q, %q) = %q, %v; want %q, %v", consumer, key, id, held, wantLetter, wantHeld)
	}
}

func (e *ledgerEnv) park(consumer string, m idem.Message) {
	e.t.Helper()
	if err := e.l.Park(e.ctx, consumer, m); err != nil {
		e.t.Fatalf("Park(%q, %q): %v", consumer, m.ID, err)
	}
}

// letGo lets go of key and checks that the messages parked behind it come
// back whole and in order.
func (e *ledgerEnv) letGo(consumer, key string, want ...idem.Message) {
	e.t.Helper()
	got, err := e.l.LetGo(e.ctx, consumer, key)
	if err != nil {
		e.t.Fatalf("LetGo(%q, %q): %v", consumer, key, err)
	}
	gotIDs, wantIDs := make([]string, len(got)), make([]string, len(want))
	for i, m := range got {
		gotIDs[i] = m.ID
	}
	for i, m := range want {
		wantIDs[i] = m.ID
	}
	if fmt.Sprint(gotIDs) != fmt.Sprint(wantIDs) {
		e.t.Errorf("LetGo(%q, %q) = %v, want %v", consumer, key, gotIDs, wantIDs)
		return
	}
	for i := range got {
		if d := messageDiff(got[i], want[i], true); d != "" {
			e.t.Errorf("LetGo(%q, %q): message %q differs:\n\t%s", consumer, key, want[i].ID, d)
		}
	}
}

// keyedEvent returns event i with key.
func keyedEvent(i int, key string) idem.Message {
	m := event(i)
	m.Key = key
	return m
}

func testLedgerAttempts(t *testing.T, e *ledgerEnv) {
	e.wantAttempts("c", "m-1")
	var want []idem.Attempt
	for n := 1; n <= 4; n++ {
		want = append(want, attempt(n))
		got := e.record("c", "m-1", attempt(n))
		if d := attemptsDiff(got, want); d != "" {
			t.Errorf("RecordAttempt #%d returned %s", n, d)
		}
	}
	e.wantAttempts("c", "m-1", want...)
}

func testLedgerForget(t *testing.T, e *ledgerEnv) {
	e.record("c", "m-1", attempt(1))
	e.record("c", "m-1", attempt(2))
	e.record("c", "m-2", attempt(1))
	if err := e.l.ForgetAttempts(e.ctx, "c", "m-1"); err != nil {
		t.Fatalf("ForgetAttempts: %v", err)
	}
	e.wantAttempts("c", "m-1")
	e.wantAttempts("c", "m-2", attempt(1))
	if err := e.l.ForgetAttempts(e.ctx, "c", "m-1"); err != nil {
		t.Errorf("ForgetAttempts of a message with none = %v, want nil", err)
	}
	// Counting starts again from nothing.
	if got := e.record("c", "m-1", attempt(1)); attemptsDiff(got, []idem.Attempt{attempt(1)}) != "" {
		t.Errorf("RecordAttempt after ForgetAttempts = %+v, want only the new attempt", got)
	}
}

func testLedgerHoldParkLetGo(t *testing.T, e *ledgerEnv) {
	e.wantHeld("c", "acct-1", "", false)
	if err := e.l.HoldBack(e.ctx, "c", "acct-1", "dl-7"); err != nil {
		t.Fatalf("HoldBack: %v", err)
	}
	e.wantHeld("c", "acct-1", "dl-7", true)
	m1, m2, m3 := keyedEvent(1, "acct-1"), keyedEvent(2, "acct-1"), keyedEvent(3, "acct-1")
	e.park("c", m1)
	e.park("c", m2)
	e.park("c", m3)
	e.letGo("c", "acct-1", m1, m2, m3)
	e.wantHeld("c", "acct-1", "", false)
	e.letGo("c", "acct-1") // nothing left

	// The key can be held and parked again afterwards.
	if err := e.l.HoldBack(e.ctx, "c", "acct-1", "dl-8"); err != nil {
		t.Fatalf("HoldBack again: %v", err)
	}
	e.wantHeld("c", "acct-1", "dl-8", true)
	m4 := keyedEvent(4, "acct-1")
	e.park("c", m4)
	e.letGo("c", "acct-1", m4)
}

func testLedgerParkTwice(t *testing.T, e *ledgerEnv) {
	if err := e.l.HoldBack(e.ctx, "c", "acct-1", "dl-1"); err != nil {
		t.Fatalf("HoldBack: %v", err)
	}
	m1, m2, m3 := keyedEvent(1, "acct-1"), keyedEvent(2, "acct-1"), keyedEvent(3, "acct-1")
	e.park("c", m1)
	e.park("c", m2)
	e.park("c", m3)
	e.park("c", m2) // a redelivery of m2
	e.park("c", m1)
	e.letGo("c", "acct-1", m1, m2, m3)
}

func testLedgerIndependent(t *testing.T, e *ledgerEnv) {
	e.record("c1", "m-1", attempt(1))
	e.record("c1", "m-1", attempt(2))
	e.record("c2", "m-1", attempt(3))
	e.wantAttempts("c1", "m-1", attempt(1), attempt(2))
	e.wantAttempts("c2", "m-1", attempt(3))
	e.wantAttempts("c1", "m-2")

	if err := e.l.HoldBack(e.ctx, "c1", "acct-1", "dl-1"); err != nil {
		t.Fatalf("HoldBack: %v", err)
	}
	if err := e.l.HoldBack(e.ctx, "c1", "acct-2", "dl-2"); err != nil {
		t.Fatalf("HoldBack: %v", err)
	}
	e.wantHeld("c2", "acct-1", "", false)
	e.wantHeld("c1", "acct-3", "", false)
	a1, a2, b1, c2m := keyedEvent(1, "acct-1"), keyedEvent(2, "acct-2"), keyedEvent(3, "acct-1"), keyedEvent(4, "acct-1")
	e.park("c1", a1)
	e.park("c1", a2)
	e.park("c1", b1)
	e.park("c2", c2m) // another consumer, same key
	e.park("c2", a1)  // another consumer, same message

	e.letGo("c1", "acct-1", a1, b1)
	e.wantHeld("c1", "acct-1", "", false)
	e.wantHeld("c1", "acct-2", "dl-2", true)
	e.letGo("c1", "acct-2", a2)
	e.letGo("c2", "acct-1", c2m, a1)
}

func testLedgerInvalid(t *testing.T, e *ledgerEnv) {
	noID := keyedEvent(1, "acct-1")
	noID.ID = ""
	checks := map[string]error{
		"RecordAttempt with no consumer": func() error {
			_, err := e.l.RecordAttempt(e.ctx, "", "m-1", attempt(1))
			return err
		}(),
		"RecordAttempt with no dedup key": func() error {
			_, err := e.l.RecordAttempt(e.ctx, "c", "", attempt(1))
			return err
		}(),
		"HoldBack with no key":      e.l.HoldBack(e.ctx, "c", "", "dl-1"),
		"HoldBack with no letter":   e.l.HoldBack(e.ctx, "c", "acct-1", ""),
		"Park with no consumer":     e.l.Park(e.ctx, "", keyedEvent(1, "acct-1")),
		"Park a message with no ID": e.l.Park(e.ctx, "c", noID),
	}
	for what, err := range checks {
		if !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s = %v, want idem.ErrInvalidArgument", what, err)
		}
	}
	e.wantHeld("c", "acct-1", "", false)
	e.letGo("c", "acct-1")
}
