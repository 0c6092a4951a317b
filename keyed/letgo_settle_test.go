package keyed_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// A Settle of a key the Completer holds after a failed resume keeps the
// operator's answer under that resume's token, without a claim of its own.
// A LetGo of the key meanwhile must not give the key back under it: a
// client's retry or another replica would take the key over, and the
// Settle, refused, would lose the operator's answer. The LetGo waits for
// the Settle, and then has nothing left to let go.
func TestLetGoWaitsForASettleOfTheKey(t *testing.T) {
	t.Parallel()
	h, waiting := heldAfterAFailedResume(t, nil)
	ctx := t.Context()
	held, err := h.mem.Get(ctx, "", "k")
	if err != nil {
		t.Fatal(err)
	}
	letGo := make(chan error, 1)
	_, err = h.comp.SettleRecorded(ctx, "", "k", operatorsAnswer, func(context.Context, bool) error {
		// The Settle holds the key and is about to keep its answer.
		go func() { letGo <- h.comp.LetGo(ctx, "", "k") }()
		select {
		case <-waiting:
		case err := <-letGo:
			letGo <- err
			retry, cerr := h.mem.Claim(ctx, idem.ClaimRequest{Key: "k", Fingerprint: held.Fingerprint, Lease: 12 * time.Second, TTL: time.Hour})
			t.Errorf("LetGo ended (%v) while a Settle held the key; a retry's claim then: %v, %v; want the LetGo to wait for the Settle", err, retry.Outcome, cerr)
		}
		return nil
	})
	if err != nil {
		t.Errorf("SettleRecorded with a LetGo of the key meanwhile = %v; want the key settled", err)
	}
	if err := <-letGo; err != nil {
		t.Errorf("LetGo = %v; want nil, nothing left to let go once the key is settled", err)
	}
	wantSettled(t, h.mem)
	if f := h.comp.Failures("", "k"); f.Holding || f.Count != 0 {
		t.Errorf("Failures after the Settle: %+v; want none, the key settled", f)
	}
}

// yieldHeldUp is a store whose first Yield waits until release is closed
// and then fails without reaching the store.
type yieldHeldUp struct {
	*idemmem.Store
	yielding chan struct{} // closed as the first Yield arrives
	release  chan struct{}
	first    bool
}

func (s *yieldHeldUp) Yield(ctx context.Context, ref idem.Ref) error {
	if !s.first {
		s.first = true
		close(s.yielding)
		<-s.release
		return errStoreDown
	}
	return s.Store.Yield(ctx, ref)
}

// A Settle while a LetGo of the key is under way waits for it, then acts
// on the key as the LetGo left it. A LetGo whose Yield fails leaves the
// Completer holding the key under the failed resume's lease, which the
// Settle then settles at once; had it read the key while the Yield was on
// its way, it would have found the Completer holding nothing and refused
// the key as held by a live execution, the Completer's own.
func TestSettleWaitsForALetGoOfTheKey(t *testing.T) {
	t.Parallel()
	var store *yieldHeldUp
	h, waiting := heldAfterAFailedResume(t, func(mem *idemmem.Store) idem.Store {
		store = &yieldHeldUp{Store: mem, yielding: make(chan struct{}), release: make(chan struct{})}
		return store
	})
	ctx := t.Context()
	letGo := make(chan error, 1)
	go func() { letGo <- h.comp.LetGo(ctx, "", "k") }()
	receive(t, store.yielding, "LetGo did not call Yield")
	settled := make(chan error, 1)
	go func() {
		_, err := h.comp.Settle(ctx, "", "k", operatorsAnswer, false)
		settled <- err
	}()
	select {
	case <-waiting:
	case err := <-settled:
		settled <- err
		t.Errorf("Settle ended (%v) while a LetGo's Yield was on its way; want it to wait for the LetGo", err)
	case <-time.After(waitBound):
		t.Fatalf("Settle neither waited for the LetGo nor ended within %v", waitBound)
	}
	close(store.release)
	if err := receive(t, letGo, "LetGo did not return once its Yield did"); !errors.Is(err, errStoreDown) {
		t.Errorf("LetGo = %v; want the Yield's error", err)
	}
	if err := receive(t, settled, "Settle did not return after the LetGo"); err != nil {
		t.Errorf("Settle after a LetGo whose Yield failed = %v; want the key the Completer still holds settled", err)
	}
	wantSettled(t, h.mem)
}

// operatorsAnswer is the answer the tests' Settles keep.
var operatorsAnswer = idem.Response{Status: 502, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte("settled by an operator")}

// heldAfterAFailedResume returns a failingFirst (its store made by wrap)
// whose Completer holds key "k" under the lease of its failed resume
// (ResumeFailures.Holding, checked), and
// a channel that receives, when nothing is waiting to be received, each
// time an action of that Completer on a key starts to wait for another.
func heldAfterAFailedResume(t *testing.T, wrap func(*idemmem.Store) idem.Store) (*failingFirst, <-chan struct{}) {
	t.Helper()
	h := newFailingFirst(t, wrap)
	abandon(t, h.mem, "k")
	resumed := make(chan error, 1)
	go func() {
		_, err := h.comp.ResumeKey(t.Context(), "", "k", false)
		resumed <- err
	}()
	if err := receive(t, resumed, "ResumeKey of the abandoned key did not return"); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
	}
	if f := h.comp.Failures("", "k"); !f.Holding {
		t.Fatalf("after the failed resume: %+v; want the Completer holding the key", f)
	}
	waiting := make(chan struct{}, 1)
	keyed.SetWaitHook(h.comp, func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})
	return h, waiting
}

// wantSettled fails t unless key "k" is completed with operatorsAnswer.
func wantSettled(t *testing.T, mem *idemmem.Store) {
	t.Helper()
	rec, err := mem.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateCompleted || rec.Response == nil || rec.Response.Status != operatorsAnswer.Status {
		t.Errorf("the key after the Settle and the LetGo: %+v, %v; want it completed with the operator's %d", rec, err, operatorsAnswer.Status)
	}
}

// releaseBeforeClaim is the in-memory store where, once armed, the next
// Claim first finds the key released: the execution holding it learned
// that nothing happened outside (ReleaseWithPoint under its token).
type releaseBeforeClaim struct {
	*idemmem.Store
	armed atomic.Bool
}

func (s *releaseBeforeClaim) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if s.armed.CompareAndSwap(true, false) {
		rec, err := s.Get(ctx, req.Scope, req.Key)
		if err != nil {
			return idem.Claim{}, err
		}
		if err := s.ReleaseWithPoint(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: rec.Token}); err != nil {
			return idem.Claim{}, err
		}
	}
	return s.Store.Claim(ctx, req)
}

// settleAfterATakeoverReleasedMeanwhile lets the failed resume's lease
// end, has another replica take the key over and stop at its point too
// (so the Settle reads it under a token the Completer does not hold, and
// claims it), then Settles with the store releasing the key just before
// that claim: the Settle claims it anew and gives it back.
func settleAfterATakeoverReleasedMeanwhile(t *testing.T, h *failingFirst, store *releaseBeforeClaim) {
	t.Helper()
	ctx := t.Context()
	if err := h.mem.Yield(ctx, takenOverByAnother(t, h, 13*time.Second)); err != nil {
		t.Fatal(err)
	}
	store.armed.Store(true)
	if _, err := h.comp.Settle(ctx, "", "k", operatorsAnswer, false); !errors.Is(err, keyed.ErrNotStopped) {
		t.Fatalf("Settle of a key released meanwhile: %v; want ErrNotStopped", err)
	}
	if store.armed.Load() {
		t.Fatal("the Settle never claimed the key")
	}
}

// A Settle that claims anew a key released since it read it, and gives it
// back, has ended every lease under an older token, the one the Completer
// held the key under after its failed resume included: Failures must no
// longer say the Completer holds the key (the console shows it, and offers
// to let it go), nor UnknownKeys name that lease's token.
func TestSettleOfAKeyReleasedMeanwhileForgetsTheOlderHold(t *testing.T) {
	t.Parallel()
	var store *releaseBeforeClaim
	h, _ := heldAfterAFailedResume(t, func(mem *idemmem.Store) idem.Store {
		store = &releaseBeforeClaim{Store: mem}
		return store
	})
	settleAfterATakeoverReleasedMeanwhile(t, h, store)
	if _, err := h.mem.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the key after the Settle: %v; want it given back (not found)", err)
	}
	wantOlderHoldForgotten(t, h, "a Settle that claimed the key anew and gave it back")
}

// A resume that takes over anew a key the Completer held after an earlier
// failed resume (that lease ended, another replica took the key over and
// stopped at its point too) ends the older lease with its claim, whatever
// becomes of the resume: when the point it finds cannot be opened, and it
// yields the key, Failures must no longer say the Completer holds the key,
// nor UnknownKeys name the older lease's token, as after a Settle's claim.
func TestResumeOfAPointItCannotOpenForgetsTheOlderHold(t *testing.T) {
	t.Parallel()
	h, _ := heldAfterAFailedResume(t, nil)
	ctx := t.Context()
	// Sealed with a key this engine lacks (it has no BodyKeys).
	sealed, err := keyed.ResealPoint([]keyed.BodyKey{bodyKey1}, "", "k", "k", "charging", []byte(`{"charge":"ch_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	ref := takenOverByAnother(t, h, 13*time.Second)
	if err := h.mem.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: "charging", Data: sealed}); err != nil {
		t.Fatal(err)
	}
	if err := h.mem.Yield(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := h.comp.ResumeKey(ctx, "", "k", false); err == nil || !strings.Contains(err.Error(), "cannot be opened") {
		t.Fatalf("ResumeKey of a point it cannot open = %v; want that error", err)
	}
	wantOlderHoldForgotten(t, h, "a resume that took the key over anew and yielded it")
}

// takenOverByAnother advances the clock by after (past the lease the
// Completer held key "k" under) and has another replica take the key
// over: it returns that replica's ref, for the caller to stop the key
// with.
func takenOverByAnother(t *testing.T, h *failingFirst, after time.Duration) idem.Ref {
	t.Helper()
	h.clock.Advance(after)
	other, err := h.mem.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", []byte("k")),
		Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil || other.Outcome != idem.Acquired {
		t.Fatalf("the other replica's takeover: %v, %v", other.Outcome, err)
	}
	return idem.Ref{Key: "k", Token: other.Token}
}

// wantOlderHoldForgotten fails t unless, after what after names, the
// Completer no longer says it holds key "k" (the console shows a hold,
// and offers to let it go), nor UnknownKeys names a held lease's token
// for it.
func wantOlderHoldForgotten(t *testing.T, h *failingFirst, after string) {
	t.Helper()
	if f := h.comp.Failures("", "k"); f.Holding {
		t.Errorf("after %s: %+v; want no hold", after, f)
	}
	for _, ref := range h.comp.UnknownKeys() {
		if ref.Key == "k" && ref.Token != 0 {
			t.Errorf("after %s, UnknownKeys names %q under token %d; want no held lease's token", after, ref.Key, ref.Token)
		}
	}
}

// A Settle that claims anew a key released since it read it learns the
// key's outcome as a resume that does learns it: released, nothing left
// unknown. Like the resume, it forgets the key's failed resumes, so that
// Stats().Unknown (which the completer's alert on unknown outcomes reads)
// and UnknownKeys no longer count a key that is gone.
func TestSettleOfAKeyReleasedMeanwhileForgetsItsUnknownOutcome(t *testing.T) {
	t.Parallel()
	var store *releaseBeforeClaim
	h, _ := heldAfterAFailedResume(t, func(mem *idemmem.Store) idem.Store {
		store = &releaseBeforeClaim{Store: mem}
		return store
	})
	if n := h.comp.Stats().Unknown; n != 1 {
		t.Fatalf("after the failed resume: %d unknown; want 1", n)
	}
	settleAfterATakeoverReleasedMeanwhile(t, h, store)
	if f, n := h.comp.Failures("", "k"), h.comp.Stats().Unknown; f.Count != 0 || f.Holding || n != 0 {
		t.Errorf("after a Settle that found the key released: Failures %+v, %d unknown; want none, as after a resume that found it so", f, n)
	}
	for _, ref := range h.comp.UnknownKeys() {
		if ref.Key == "k" {
			t.Errorf("UnknownKeys names %q after it was found released; want it forgotten", ref.Key)
		}
	}
}
