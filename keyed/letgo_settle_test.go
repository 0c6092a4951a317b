package keyed_test

import (
	"context"
	"errors"
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
	<-store.yielding
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
	}
	close(store.release)
	if err := <-letGo; !errors.Is(err, errStoreDown) {
		t.Errorf("LetGo = %v; want the Yield's error", err)
	}
	if err := <-settled; err != nil {
		t.Errorf("Settle after a LetGo whose Yield failed = %v; want the key the Completer still holds settled", err)
	}
	wantSettled(t, h.mem)
}

// operatorsAnswer is the answer the tests' Settles keep.
var operatorsAnswer = idem.Response{Status: 502, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte("settled by an operator")}

// heldAfterAFailedResume returns a failingFirst (its store made by wrap)
// whose Completer holds key "k" under the lease of its failed resume, and
// a channel that receives, when nothing is waiting to be received, each
// time an action of that Completer on a key starts to wait for another.
func heldAfterAFailedResume(t *testing.T, wrap func(*idemmem.Store) idem.Store) (*failingFirst, <-chan struct{}) {
	t.Helper()
	h := newFailingFirst(t, wrap)
	abandon(t, h.mem, "k")
	if _, err := h.comp.ResumeKey(t.Context(), "", "k", false); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
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
