package keyed_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// An action on a key that gave up waiting for another action of the same
// Completer on it says which was under way: an operator told "this
// completer is resuming it" while a Settle or a LetGo held the key looks
// for a resume that is not there.
func TestWaitThatEndedSaysWhatWasUnderWay(t *testing.T) {
	t.Parallel()
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	wantWhat := func(t *testing.T, err error, what string) {
		t.Helper()
		if !errors.Is(err, keyed.ErrBeingFinished) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "this completer is "+what) {
			t.Errorf("an action that gave up waiting = %v; want ErrBeingFinished, the context's end, and %q", err, "this completer is "+what)
		}
	}

	t.Run("a Settle", func(t *testing.T) {
		t.Parallel()
		h, _ := heldAfterAFailedResume(t, nil)
		var err error
		if _, serr := h.comp.SettleRecorded(t.Context(), "", "k", operatorsAnswer, func(context.Context, bool) error {
			err = h.comp.LetGo(ended, "", "k")
			return nil
		}); serr != nil {
			t.Fatal(serr)
		}
		wantWhat(t, err, "settling it")
	})

	t.Run("a resume", func(t *testing.T) {
		t.Parallel()
		h := newFailingFirst(t, nil)
		abandon(t, h.mem, "k")
		h.fail.Store(false)
		var err error
		if _, rerr := h.comp.ResumeRecorded(t.Context(), "", "k", func(context.Context, bool, keyed.ResumeEnd) error {
			_, err = h.comp.Settle(ended, "", "k", operatorsAnswer, false)
			return nil
		}); rerr != nil {
			t.Fatal(rerr)
		}
		wantWhat(t, err, "resuming it")
	})

	t.Run("a LetGo", func(t *testing.T) {
		t.Parallel()
		var store *yieldHeldUp
		h, _ := heldAfterAFailedResume(t, func(mem *idemmem.Store) idem.Store {
			store = &yieldHeldUp{Store: mem, yielding: make(chan struct{}), release: make(chan struct{})}
			return store
		})
		letGo := make(chan error, 1)
		go func() { letGo <- h.comp.LetGo(t.Context(), "", "k") }()
		<-store.yielding
		_, err := h.comp.ResumeKey(ended, "", "k", false)
		close(store.release)
		if lerr := <-letGo; !errors.Is(lerr, errStoreDown) {
			t.Errorf("LetGo = %v; want the Yield's error", lerr)
		}
		wantWhat(t, err, "letting it go")
	})
}
