package keyed_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// lateRenewal is a store whose first renewal of a lease is on its way
// until either the key's lease is yielded (it then lands, as a renewal
// sent before the Yield and answered after it does) or its context ends
// (it is then not written).
type lateRenewal struct {
	*idemmem.Store
	renewing chan struct{} // closed once the renewal was sent
	yielded  chan struct{} // closed by the first Yield
	renewed  chan error    // the renewal's result, once it returned
}

func (s *lateRenewal) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	close(s.renewing)
	var end time.Time
	var err error
	select {
	case <-s.yielded:
		end, err = s.Store.Renew(context.WithoutCancel(ctx), ref, lease)
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.renewed <- err
	return end, err
}

func (s *lateRenewal) Yield(ctx context.Context, ref idem.Ref) error {
	err := s.Store.Yield(ctx, ref)
	close(s.yielded)
	return err
}

// After a failed resume the Completer holds the key under the resume's
// lease until LetGo yields it, so that another completer or the client's
// retry can take the key on at once. No renewal of that lease may reach
// the store after the Yield: it would give the key a live lease again,
// for nobody, and LetGo would have changed nothing. So a resume that ends
// holding the key returns only once no renewal of its lease is on its way.
func TestLetGoAfterAFailedResumeIsNotUndoneByARenewal(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	store := &lateRenewal{Store: mem, renewing: make(chan struct{}), yielded: make(chan struct{}), renewed: make(chan error, 1)}
	// The lease is short in real time too: a renewal's own timeout is a
	// sixth of it.
	const lease = 600 * time.Millisecond
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Timeout: time.Minute,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			close(running)
			<-store.renewing
			return idem.Response{}, errors.New("the card network did not answer")
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, mem, "k")
	resumed := make(chan error, 1)
	go func() {
		_, err := comp.ResumeKey(t.Context(), "", "k", false)
		resumed <- err
	}()
	receive(t, running, "the resume did not start")
	clock.Advance(lease / 3) // the lease is due for renewal
	if err := receive(t, resumed, "ResumeKey did not return"); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
	}
	if f := comp.Failures("", "k"); !f.Holding {
		t.Fatalf("after the failed resume: %+v; want the Completer holding the key", f)
	}
	if err := comp.LetGo(t.Context(), "", "k"); err != nil {
		t.Fatalf("LetGo = %v", err)
	}
	receive(t, store.renewed, "the renewal sent while the resume ran did not return")
	rec, err := mem.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("the key after LetGo: %+v, %v; want it in flight", rec, err)
	}
	if now := clock.Now(); rec.LeaseExpiresAt.After(now) {
		t.Errorf("after LetGo the key's lease ends at %s, %s from now: a renewal sent while the resume ran reached the store after LetGo's Yield; want the lease ended",
			rec.LeaseExpiresAt.Format(time.RFC3339Nano), rec.LeaseExpiresAt.Sub(now))
	}
}

// yieldDown is a store whose first Yield fails without reaching it.
type yieldDown struct {
	*idemmem.Store
	failed bool
}

func (s *yieldDown) Yield(ctx context.Context, ref idem.Ref) error {
	if !s.failed {
		s.failed = true
		return errStoreDown
	}
	return s.Store.Yield(ctx, ref)
}

// A LetGo whose Yield failed leaves the key under the lease the failed
// resume took: the Completer still holds it (ResumeFailures.Holding), so
// that LetGo can be tried again, and ResumeKey acts on the key at once, as
// on any key it holds, rather than refusing it as being finished by
// another until that lease ends.
func TestLetGoThatFailedStillHoldsTheKey(t *testing.T) {
	t.Parallel()
	h := newFailingFirst(t, func(mem *idemmem.Store) idem.Store { return &yieldDown{Store: mem} })
	comp := h.comp
	abandon(t, h.mem, "k")
	if _, err := comp.ResumeKey(t.Context(), "", "k", false); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
	}
	if err := comp.LetGo(t.Context(), "", "k"); !errors.Is(err, errStoreDown) {
		t.Fatalf("LetGo = %v; want the Yield's error", err)
	}
	if f := comp.Failures("", "k"); !f.Holding {
		t.Errorf("after a LetGo whose Yield failed: %+v; want the Completer still holding the key under its lease", f)
	}
	h.fail.Store(false)
	if finished, err := comp.ResumeKey(t.Context(), "", "k", false); !finished || err != nil {
		t.Errorf("ResumeKey after the failed LetGo = %v, %v; want the key it holds finished at once", finished, err)
	}
}

// failingFirst is a Completer, on an idemmem store with an injected clock
// and a 12 s lease, whose Resume fails (the card network did not answer)
// while fail is set, as it is at first, and answers 201 once it is not.
type failingFirst struct {
	clock *idemmem.Clock
	mem   *idemmem.Store
	comp  *keyed.Completer
	fail  atomic.Bool
}

// newFailingFirst makes a failingFirst whose engine's store is wrap(mem),
// or mem itself when wrap is nil.
func newFailingFirst(t *testing.T, wrap func(*idemmem.Store) idem.Store) *failingFirst {
	t.Helper()
	h := &failingFirst{clock: idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	h.mem = idemmem.NewStore(&idemmem.Config{Clock: h.clock})
	var store idem.Store = h.mem
	if wrap != nil {
		store = wrap(h.mem)
	}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: h.clock, Timers: h.clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h.fail.Store(true)
	h.comp, err = eng.NewCompleter(&keyed.CompleterConfig{
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			if h.fail.Load() {
				return idem.Response{}, errors.New("the card network did not answer")
			}
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A LetGo forgets only the hold it read: when a round of the same
// Completer took the key over after the read (its lease had ended) and
// failed, the Completer holds the key under the round's newer token, and
// the LetGo must leave that newer hold in place, so that LetGo and
// ResumeKey still act on it at once, and say so (ErrHeldAnew) rather than
// report the key let go.
func TestLetGoKeepsANewerHold(t *testing.T) {
	t.Parallel()
	h := newFailingFirst(t, nil)
	clock, mem, comp := h.clock, h.mem, h.comp
	abandon(t, mem, "k")
	if _, err := comp.ResumeKey(t.Context(), "", "k", false); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
	}
	first, err := mem.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	hooked := false
	keyed.SetLetGoHook(comp, func() {
		if hooked {
			return
		}
		hooked = true
		// The failed resume's lease ends; a round takes the key over
		// and fails too.
		clock.Advance(13 * time.Second)
		if n, err := comp.RunOnce(t.Context()); n != 0 || err != nil {
			t.Errorf("round in between = %d, %v; want 0 finished, no error", n, err)
		}
	})
	// The key still needs letting go, under the newer lease: LetGo must
	// not say it was let go.
	if err := comp.LetGo(t.Context(), "", "k"); !errors.Is(err, keyed.ErrHeldAnew) {
		t.Fatalf("LetGo of the older hold = %v; want ErrHeldAnew, the key held under a newer lease", err)
	}
	if !hooked {
		t.Fatal("the LetGo never reached its hook")
	}
	rec, err := mem.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Token == first.Token || !rec.LeaseExpiresAt.After(clock.Now()) {
		t.Fatalf("after the round in between: token %d (first %d), lease to %s; want the round's newer, live lease", rec.Token, first.Token, rec.LeaseExpiresAt)
	}
	if f := comp.Failures("", "k"); !f.Holding || f.Count != 2 {
		t.Errorf("after a LetGo of the older hold: %+v; want the Completer still holding the key under the round's lease, 2 failures", f)
	}
	h.fail.Store(false)
	if finished, err := comp.ResumeKey(t.Context(), "", "k", false); !finished || err != nil {
		t.Errorf("ResumeKey after the LetGo = %v, %v; want the key it holds finished at once", finished, err)
	}
}

// A LetGo that read the hold of a failed resume, while a ResumeKey of the
// key gives that lease back, takes the key anew and fails again, finds
// the key held under the newer lease: it says so (ErrHeldAnew), and a
// LetGo again gives that lease back.
func TestLetGoBehindAResumeThatHeldTheKeyAnew(t *testing.T) {
	t.Parallel()
	h, _ := heldAfterAFailedResume(t, nil)
	comp := h.comp
	hooked := false
	keyed.SetLetGoHook(comp, func() {
		if hooked {
			return
		}
		hooked = true
		if _, err := comp.ResumeKey(t.Context(), "", "k", false); err == nil {
			t.Error("ResumeKey in between = nil; want the resume's error")
		}
	})
	if err := comp.LetGo(t.Context(), "", "k"); !errors.Is(err, keyed.ErrHeldAnew) {
		t.Fatalf("LetGo of the hold a ResumeKey replaced = %v; want ErrHeldAnew", err)
	}
	if f := comp.Failures("", "k"); !f.Holding || f.Count != 2 {
		t.Errorf("after the LetGo of the replaced hold: %+v; want the Completer holding the key under the newer lease, 2 failures", f)
	}
	if err := comp.LetGo(t.Context(), "", "k"); err != nil {
		t.Fatalf("LetGo again = %v; want the newer lease given back", err)
	}
	rec, err := h.mem.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if now := h.clock.Now(); rec.State != idem.StateInFlight || rec.LeaseExpiresAt.After(now) {
		t.Errorf("after LetGo again: state %s, lease to %s (now %s); want in flight, its lease ended", rec.State, rec.LeaseExpiresAt, now)
	}
}

// olderRenewal is a store whose first renewal stays on its way until a
// Yield reaches the store (it then lands, as a renewal sent before the
// Yield and answered after it does) or its context ends (it is then not
// written), and whose first Yield fails without reaching the store.
type olderRenewal struct {
	*idemmem.Store
	renewing chan struct{} // closed once the first renewal was sent
	yielded  chan struct{} // closed by the first Yield that reaches the store
	renewed  chan error    // the first renewal's result, once it returned
	renewals atomic.Int32
	yields   atomic.Int32
}

func (s *olderRenewal) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if s.renewals.Add(1) != 1 {
		return s.Store.Renew(ctx, ref, lease)
	}
	close(s.renewing)
	var end time.Time
	var err error
	select {
	case <-s.yielded:
		end, err = s.Store.Renew(context.WithoutCancel(ctx), ref, lease)
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.renewed <- err
	return end, err
}

func (s *olderRenewal) Yield(ctx context.Context, ref idem.Ref) error {
	switch s.yields.Add(1) {
	case 1:
		return errStoreDown
	case 2:
		err := s.Store.Yield(ctx, ref)
		close(s.yielded)
		return err
	}
	return s.Store.Yield(ctx, ref)
}

// A Settle that takes over anew a key the Completer held after a failed
// resume (that lease ended, another replica took the key over and stopped
// at its point too) ends the older lease with its claim. When its
// give-back then fails (its record failed, and so did its Yield), the
// Completer holds the key under the Settle's token and lease (the
// Settle's claim, which no heartbeat renews), not the older one's: a
// LetGo of it gives the key back at once, even while a renewal of the
// older lease, sent as the failed resume ran, is still on its way (the
// store refuses it whenever it lands). Waiting for that renewal would
// hold the LetGo, and a Settle or ResumeKey of the key, for up to a
// renewal's timeout (a sixth of the lease) for a lease that is gone.
func TestLetGoOfAKeyHeldAnewDoesNotWaitForTheOlderLease(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	store := &olderRenewal{Store: mem, renewing: make(chan struct{}), yielded: make(chan struct{}), renewed: make(chan error, 1)}
	// Long in real time too: a renewal's own timeout is a sixth of it,
	// and the older renewal must still be on its way at the LetGo.
	const lease = 2 * time.Minute
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Timeout: time.Minute,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			close(running)
			<-store.renewing
			return idem.Response{}, errors.New("the card network did not answer")
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := &failingFirst{clock: clock, mem: mem, comp: comp}
	abandon(t, mem, "k")
	resumed := make(chan error, 1)
	go func() {
		_, err := comp.ResumeKey(t.Context(), "", "k", false)
		resumed <- err
	}()
	receive(t, running, "the resume did not start")
	clock.Advance(lease / 3) // the lease is due for renewal
	if err := receive(t, resumed, "ResumeKey did not return"); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
	}
	// That lease ends; another replica takes the key over and stops at
	// its point too.
	if err := mem.Yield(t.Context(), takenOverByAnother(t, h, lease+time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = comp.SettleRecorded(t.Context(), "", "k", operatorsAnswer, func(context.Context, bool) error { return errNotWritten })
	if !errors.Is(err, keyed.ErrNotRecorded) || !errors.Is(err, errStoreDown) {
		t.Fatalf("SettleRecorded whose record and Yield fail = %v; want ErrNotRecorded and the Yield's error", err)
	}
	if f := comp.Failures("", "k"); !f.Holding {
		t.Fatalf("after a SettleRecorded whose Yield failed: %+v; want the Completer holding the key", f)
	}
	if err := comp.LetGo(t.Context(), "", "k"); err != nil {
		t.Fatalf("LetGo = %v", err)
	}
	if err := receive(t, store.renewed, "the older lease's renewal did not return"); errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the older lease's renewal ended by its timeout (%v) before LetGo's Yield reached the store: the LetGo waited for the older lease; want the newer hold given back at once", err)
	}
	rec, err := mem.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if now := clock.Now(); rec.State != idem.StateInFlight || rec.LeaseExpiresAt.After(now) {
		t.Errorf("after LetGo: state %s, lease to %s (now %s); want in flight, its lease ended", rec.State, rec.LeaseExpiresAt, now)
	}
}
