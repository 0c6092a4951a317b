package keyed_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

var errNotWritten = errors.New("the audit history did not answer")

// wantHeldThenLetGo fails t unless the Completer still holds key "k" after
// an action whose Yield failed, and a LetGo then gives the key back: its
// lease ended, so that the next resume takes it over at once.
func wantHeldThenLetGo(t *testing.T, h *failingFirst, after string) {
	t.Helper()
	if f := h.comp.Failures("", "k"); !f.Holding {
		t.Errorf("after %s whose Yield failed: %+v; want the Completer holding the key under the lease it may still have", after, f)
	}
	if err := h.comp.LetGo(t.Context(), "", "k"); err != nil {
		t.Errorf("LetGo after %s whose Yield failed = %v", after, err)
	}
	rec, err := h.mem.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if now := h.clock.Now(); rec.State != idem.StateInFlight || rec.LeaseExpiresAt.After(now) {
		t.Errorf("after %s and a LetGo: state %s, lease to %s (now %s); want in flight, its lease ended", after, rec.State, rec.LeaseExpiresAt, now)
	}
	h.fail.Store(false)
	if finished, err := h.comp.ResumeKey(t.Context(), "", "k", false); !finished || err != nil {
		t.Errorf("ResumeKey after %s and a LetGo = %v, %v; want the key finished at once", after, finished, err)
	}
}

// A Settle whose record fails gives the key back under the lease it held
// it by; when that Yield fails too, the lease may still be live, and the
// Completer keeps holding the key under it, so that LetGo can give it back
// rather than the key staying refused as being finished until the lease
// ends.
func TestSettleWhoseYieldFailedStillHoldsTheKey(t *testing.T) {
	t.Parallel()
	h, _ := heldAfterAFailedResume(t, func(mem *idemmem.Store) idem.Store { return &yieldDown{Store: mem} })
	_, err := h.comp.SettleRecorded(t.Context(), "", "k", operatorsAnswer, func(context.Context, bool) error { return errNotWritten })
	if !errors.Is(err, keyed.ErrNotRecorded) || !errors.Is(err, errStoreDown) {
		t.Fatalf("SettleRecorded whose record and Yield fail = %v; want ErrNotRecorded and the Yield's error", err)
	}
	wantHeldThenLetGo(t, h, "a Settle")
}

// The same for a Settle that claimed the key anew (the Completer held
// nothing of it) and whose record fails: the Completer takes the hold
// under the Settle's claim.
func TestSettleThatClaimedTheKeyAndFailedToYieldHoldsIt(t *testing.T) {
	t.Parallel()
	h := newFailingFirst(t, func(mem *idemmem.Store) idem.Store { return &yieldDown{Store: mem} })
	abandon(t, h.mem, "k")
	_, err := h.comp.SettleRecorded(t.Context(), "", "k", operatorsAnswer, func(context.Context, bool) error { return errNotWritten })
	if !errors.Is(err, keyed.ErrNotRecorded) || !errors.Is(err, errStoreDown) {
		t.Fatalf("SettleRecorded whose record and Yield fail = %v; want ErrNotRecorded and the Yield's error", err)
	}
	wantHeldThenLetGo(t, h, "a Settle")
}

// A ResumeRecorded whose record fails gives the key back, in flight at its
// point; when that Yield fails, the Completer holds the key under the
// resume's lease, so that LetGo can give it back.
func TestResumeRecordedWhoseYieldFailedHoldsTheKey(t *testing.T) {
	t.Parallel()
	h := newFailingFirst(t, func(mem *idemmem.Store) idem.Store { return &yieldDown{Store: mem} })
	abandon(t, h.mem, "k")
	h.fail.Store(false)
	_, err := h.comp.ResumeRecorded(t.Context(), "", "k", func(context.Context, bool, keyed.ResumeEnd) error { return errNotWritten })
	if !errors.Is(err, keyed.ErrNotRecorded) || !errors.Is(err, errStoreDown) {
		t.Fatalf("ResumeRecorded whose record and Yield fail = %v; want ErrNotRecorded and the Yield's error", err)
	}
	wantHeldThenLetGo(t, h, "a ResumeRecorded")
}

// An operator's action on a key no resume of the Completer failed on (a
// Settle, a ResumeRecorded) whose give-back failed (its record failed,
// then its Yield) leaves the Completer holding the key under the action's
// lease, which may still be live: the store's Abandoned does not list the
// key until that lease ends. UnknownKeys, by which the console lists the
// keys the Completer holds beside Abandoned's (and offers their LetGo),
// must name it under that lease's token, and no longer once LetGo gave
// the key back (Abandoned lists it then).
func TestUnknownKeysNamesAKeyHeldAfterAFailedGiveBack(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		act  func(*keyed.Completer) error
	}{
		{"a Settle", func(comp *keyed.Completer) error {
			_, err := comp.SettleRecorded(t.Context(), "", "k", operatorsAnswer, func(context.Context, bool) error { return errNotWritten })
			return err
		}},
		{"a ResumeRecorded", func(comp *keyed.Completer) error {
			_, err := comp.ResumeRecorded(t.Context(), "", "k", func(context.Context, bool, keyed.ResumeEnd) error { return errNotWritten })
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newFailingFirst(t, func(mem *idemmem.Store) idem.Store { return &yieldDown{Store: mem} })
			h.fail.Store(false)
			abandon(t, h.mem, "k")
			if err := c.act(h.comp); !errors.Is(err, keyed.ErrNotRecorded) || !errors.Is(err, errStoreDown) {
				t.Fatalf("%s whose record and Yield fail = %v; want ErrNotRecorded and the Yield's error", c.name, err)
			}
			rec, err := h.mem.Get(t.Context(), "", "k")
			if err != nil {
				t.Fatal(err)
			}
			if !rec.LeaseExpiresAt.After(h.clock.Now()) {
				t.Fatalf("the key after %s whose Yield failed: lease to %s; want it live (now %s)", c.name, rec.LeaseExpiresAt, h.clock.Now())
			}
			if f := h.comp.Failures("", "k"); !f.Holding || f.Count != 0 {
				t.Fatalf("after %s whose Yield failed: %+v; want the Completer holding the key, no failed resume", c.name, f)
			}
			want := idem.Ref{Key: "k", Token: rec.Token}
			if got := h.comp.UnknownKeys(); !slices.Contains(got, want) {
				t.Errorf("UnknownKeys after %s whose Yield failed = %v; want %v, the key the Completer holds under a live lease", c.name, got, want)
			}
			if err := h.comp.LetGo(t.Context(), "", "k"); err != nil {
				t.Fatalf("LetGo = %v", err)
			}
			for _, ref := range h.comp.UnknownKeys() {
				if ref.Key == "k" {
					t.Errorf("UnknownKeys after the LetGo names %v; want the key no longer held, nor counted", ref)
				}
			}
		})
	}
}
