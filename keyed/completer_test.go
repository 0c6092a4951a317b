package keyed_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// abandon leaves key in flight with a recovery point and its lease ended,
// as an execution whose holder died after the point leaves it.
func abandon(t *testing.T, store *idemmem.Store, key idem.Key) {
	t.Helper()
	ctx := t.Context()
	claim, err := store.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", []byte(key)),
		Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim %s: %v, %v", key, claim.Outcome, err)
	}
	ref := idem.Ref{Key: key, Token: claim.Token}
	if err := store.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: "charging"}); err != nil {
		t.Fatal(err)
	}
	if err := store.Yield(ctx, ref); err != nil {
		t.Fatal(err)
	}
}

// A Completer's rounds do not wait for a slow resume: a key abandoned while
// another is resumed is finished by the next round, within the Completer's
// bound, not once the slow one ends (up to Timeout later).
func TestCompleterRoundsDoNotWaitForASlowResume(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	slowEntered, letSlowGo := make(chan struct{}), make(chan struct{})
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Every: 5 * time.Millisecond, Parallel: 4, Timeout: time.Minute,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			if ex.Key == "slow" {
				close(slowEntered)
				select {
				case <-letSlowGo:
				case <-ctx.Done():
					return idem.Response{}, ctx.Err()
				}
			}
			return idem.Response{Status: 201, Body: []byte(ex.Key)}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, store, "slow")
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- comp.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v; want context.Canceled", err)
		}
	}()
	<-slowEntered
	defer close(letSlowGo)
	abandon(t, store, "next")
	// Every is 5ms: a hundred rounds' time, the slow resume still running.
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := store.Get(t.Context(), "", "next")
		if err == nil && rec.State == idem.StateCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key abandoned during a slow resume is %v (%v) 10s on; want it finished by the next round", rec.State, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rec, err := store.Get(t.Context(), "", "slow"); err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("the slow key: %v, %v; want it still in flight, its resume under way", rec.State, err)
	}
}

// completeFails is a store whose Complete fails while fail is set.
type completeFails struct {
	*idemmem.Store
	fail atomic.Bool
}

var errStoreDown = errors.New("the store does not answer")

func (s *completeFails) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if s.fail.Load() {
		return errStoreDown
	}
	return s.Store.Complete(ctx, ref, resp)
}

// A Settle whose answer the store fails to keep says so, and gives the key
// back as it found it: in flight with its point and its lease yielded, so
// that the operator's next try settles it at once rather than after the
// lease Settle took.
func TestSettleThatCannotKeepItsAnswerGivesTheKeyBack(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := &completeFails{Store: idemmem.NewStore(&idemmem.Config{Clock: clock})}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		return idem.Response{}, errors.New("not resumed in this test")
	}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, store.Store, "k")
	answer := idem.Response{Status: 409, Body: []byte("settled by an operator")}
	store.fail.Store(true)
	_, err = comp.Settle(t.Context(), "", "k", answer, false)
	if !errors.Is(err, errStoreDown) || !strings.Contains(err.Error(), "keeping the settled answer") || strings.Contains(err.Error(), "yielding") {
		t.Fatalf("Settle with the store failing: %v; want only the store's error on keeping the answer", err)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the key after the failed Settle: %+v, %v; want it in flight with its point", rec, err)
	}
	store.fail.Store(false)
	if _, err := comp.Settle(t.Context(), "", "k", answer, false); err != nil {
		t.Fatalf("the next Settle, at once: %v; want the key settled (the failed one yielded its lease)", err)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.State != idem.StateCompleted || rec.Response.Status != 409 {
		t.Fatalf("the key: %+v, %v; want it completed with the settled answer", rec, err)
	}
}

// A point the Completer cannot open (sealed with a body key its engine
// lacks) is not resumed: the round counts the key failed, its outcome
// unknown, and leaves it in flight with its point intact and its lease
// yielded, so that a Completer given the key resumes it at once rather
// than after the lease the failed round took.
func TestCompleterLeavesAPointItCannotOpen(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	data := []byte(`{"charge":"ch_1"}`)
	sealed, err := keyed.ResealPoint([]keyed.BodyKey{bodyKey1}, "", "k", "k", "charging", data)
	if err != nil {
		t.Fatal(err)
	}
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", []byte("k")),
		Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim: %v, %v", claim.Outcome, err)
	}
	ref := idem.Ref{Key: "k", Token: claim.Token}
	if err := store.SaveRecovery(t.Context(), ref, idem.RecoveryPoint{Name: "charging", Data: sealed}); err != nil {
		t.Fatal(err)
	}
	if err := store.Yield(t.Context(), ref); err != nil {
		t.Fatal(err)
	}
	completer := func(keys ...keyed.BodyKey) (*keyed.Completer, *[]string) {
		eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour, BodyKeys: keys})
		if err != nil {
			t.Fatal(err)
		}
		var saw []string
		comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(_ context.Context, ex keyed.Execution) (idem.Response, error) {
			saw = append(saw, string(ex.Recovery.Data))
			return idem.Response{Status: 201}, nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		return comp, &saw
	}
	without, sawWithout := completer(bodyKey2)
	if n, _ := without.RunOnce(t.Context()); n != 0 {
		t.Fatalf("a round without the point's body key finished %d; want none", n)
	}
	if len(*sawWithout) != 0 {
		t.Fatalf("Resume ran on a point that could not be opened: %q", *sawWithout)
	}
	if s := without.Stats(); s.Failed != 1 || s.Unknown != 1 {
		t.Errorf("stats %+v; want one failed, its outcome unknown", s)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || !bytes.Equal(rec.Recovery.Data, sealed) {
		t.Fatalf("the key: %+v, %v; want it in flight with its sealed point as it was", rec, err)
	}
	with, sawWith := completer(bodyKey2, bodyKey1)
	if n, err := with.RunOnce(t.Context()); n != 1 || err != nil {
		t.Fatalf("a round with the body key, at once: %d, %v; want the key finished (the failed round yielded it)", n, err)
	}
	if len(*sawWith) != 1 || (*sawWith)[0] != string(data) {
		t.Fatalf("Resume saw %q; want the point opened", *sawWith)
	}
}

// pointBehindFace fails its first run after saving a recovery point with
// the store directly, behind the engine's back, as an earlier execution
// does that saved one after this one's claim was read; its later runs
// answer 201.
type pointBehindFace struct {
	store   *idemmem.Store
	resumed []string // the recovery point each run started from
	refused *keyed.Refusal
}

func (f *pointBehindFace) Run(ctx context.Context, _ bool) keyed.Ran {
	ex, _ := keyed.ExecutionFromContext(ctx)
	f.resumed = append(f.resumed, ex.Recovery.Name)
	if len(f.resumed) == 1 {
		if err := f.store.SaveRecovery(ctx, idem.Ref{Scope: ex.Scope, Key: ex.Key, Token: ex.Token}, idem.RecoveryPoint{Name: "charging"}); err != nil {
			panic(err)
		}
		return keyed.Ran{Status: 502, Failure: "the card network did not answer"}
	}
	return keyed.Ran{Status: 201, Keep: true, Answer: idem.Response{Status: 201}}
}
func (f *pointBehindFace) Send()                       {}
func (f *pointBehindFace) Replay(*idem.Response) error { return nil }
func (f *pointBehindFace) Refuse(r keyed.Refusal)      { f.refused = &r }

// A failure on a key that holds a recovery point the execution did not
// know of is not a release: the store refuses it (ErrHasRecoveryPoint), and
// the key stays in flight with its point, unfinished, its lease yielded so
// that the client's retry goes on from the point at once.
func TestFailureOnAPointSavedBehindTheExecutionKeepsTheKey(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour,
		InflightWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	face := &pointBehindFace{store: store}
	req := keyed.Request{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", nil)}
	if o := eng.Serve(t.Context(), req, face); o != keyed.OutcomeUnfinished {
		t.Fatalf("the failed execution: %s; want %s", o, keyed.OutcomeUnfinished)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the key: %+v, %v; want it in flight with its point", rec, err)
	}
	face.refused = nil
	if o := eng.Serve(t.Context(), req, face); o != keyed.OutcomeExecuted || face.refused != nil {
		t.Fatalf("the retry at once: %s, refused %+v; want it run (the key's lease was yielded)", o, face.refused)
	}
	if want := []string{"", "charging"}; !slices.Equal(face.resumed, want) {
		t.Fatalf("runs started from %q; want %q", face.resumed, want)
	}
}

// An operator's ResumeKey right after this Completer's round left the key
// unknown is not refused as being finished by another: the key is held
// under the lease of that failed resume, which ResumeKey ends and takes the
// key over anew, and a Resume that now learns the outcome finishes it.
func TestResumeKeyRightAfterAFailedRound(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		if down.Load() {
			return idem.Response{}, errors.New("the card network does not answer")
		}
		return idem.Response{Status: 201}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, store, "k")
	if n, _ := comp.RunOnce(t.Context()); n != 0 || comp.Stats().Unknown != 1 {
		t.Fatalf("the round with the network down finished %d, stats %+v; want the key unknown", n, comp.Stats())
	}
	down.Store(false)
	if finished, err := comp.ResumeKey(t.Context(), "", "k", false); !finished || err != nil {
		t.Fatalf("ResumeKey at once: %v, %v; want the key finished", finished, err)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.State != idem.StateCompleted || rec.Response.Status != 201 {
		t.Fatalf("the key: %+v, %v; want it completed with Resume's answer", rec, err)
	}
}

// A failed ResumeKey leaves the key held under the lease its resume took;
// LetGo gives that lease back, so another completer (or a client's retry)
// takes the key on at once. The key stays in flight at its point.
func TestCompleterLetGoEndsTheFailedResumesLease(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	down := errors.New("the network is down")
	failing, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		return idem.Response{}, down
	}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
		return idem.Response{Status: 201}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, store, "pay")
	if finished, err := failing.ResumeKey(t.Context(), "", "pay", false); finished || !errors.Is(err, down) {
		t.Fatalf("ResumeKey = %v, %v; want the resume's error", finished, err)
	}
	if _, err := other.ResumeKey(t.Context(), "", "pay", true); !errors.Is(err, keyed.ErrBeingFinished) {
		t.Fatalf("another completer's dry run under the failed resume's lease: %v; want ErrBeingFinished", err)
	}
	if err := failing.LetGo(t.Context(), "", "pay"); err != nil {
		t.Fatal(err)
	}
	if f := failing.Failures("", "pay"); f.Holding {
		t.Fatalf("after LetGo the completer still says it holds the key: %+v", f)
	}
	if rec, err := store.Get(t.Context(), "", "pay"); err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("after LetGo: %v %q, %v; want in flight at its point", rec.State, rec.Recovery.Name, err)
	}
	if finished, err := other.ResumeKey(t.Context(), "", "pay", false); !finished || err != nil {
		t.Fatalf("another completer's ResumeKey after LetGo = %v, %v; want it finished at once", finished, err)
	}
	if err := failing.LetGo(t.Context(), "", "pay"); err != nil {
		t.Fatalf("LetGo of a key it no longer holds: %v; want nothing done", err)
	}
}

// releasedMeanwhile is the in-memory store where a key is released by its
// holder (ReleaseWithPoint: its execution ended without an answer) just
// before the first Claim of it, which so claims it anew; its own Release
// fails with errStoreDown when failRelease is set.
type releasedMeanwhile struct {
	*idemmem.Store
	raced       atomic.Bool
	failRelease bool
}

func (s *releasedMeanwhile) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if s.raced.CompareAndSwap(false, true) {
		if rec, err := s.Get(ctx, req.Scope, req.Key); err == nil {
			if err := s.ReleaseWithPoint(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: rec.Token}); err != nil {
				return idem.Claim{}, err
			}
		}
	}
	return s.Store.Claim(ctx, req)
}

func (s *releasedMeanwhile) Release(ctx context.Context, ref idem.Ref) error {
	if s.failRelease {
		return errStoreDown
	}
	return s.Store.Release(ctx, ref)
}

// A Settle that finds the key it read stopped at a point released by the
// time it claims it, and so claims a free key anew, refuses (ErrNotStopped,
// released meanwhile) and gives the key back at once, so that its next
// request runs without waiting for the lease Settle took. When giving it
// back fails, it says so in its log: the key then stays held until that
// lease ends, and the log says why.
func TestSettleOfAKeyReleasedMeanwhileGivesItBack(t *testing.T) {
	t.Parallel()
	for _, failRelease := range []bool{false, true} {
		t.Run(fmt.Sprintf("release fails %v", failRelease), func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			store := &releasedMeanwhile{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}), failRelease: failRelease}
			eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			comp, err := eng.NewCompleter(&keyed.CompleterConfig{
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
				Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
					return idem.Response{}, errors.New("not resumed in this test")
				}})
			if err != nil {
				t.Fatal(err)
			}
			abandon(t, store.Store, "k")
			_, err = comp.Settle(t.Context(), "", "k", idem.Response{Status: 409}, false)
			if !errors.Is(err, keyed.ErrNotStopped) || !strings.Contains(err.Error(), "released meanwhile") {
				t.Fatalf("Settle of a key released meanwhile: %v; want ErrNotStopped, released meanwhile", err)
			}
			rec, err := store.Get(t.Context(), "", "k")
			const warning = "could not give back a key it claimed anew"
			switch {
			case !failRelease && !errors.Is(err, idem.ErrNotFound):
				t.Errorf("the key after Settle: %v, %v; want it given back (not found)", rec.State, err)
			case !failRelease && logs.Len() != 0:
				t.Errorf("warnings logged though the key was given back: %s", logs.String())
			case failRelease && (err != nil || rec.State != idem.StateInFlight):
				t.Errorf("the key after Settle, its release failing: %v, %v; want it in flight under Settle's claim", rec.State, err)
			case failRelease && (!strings.Contains(logs.String(), warning) || !strings.Contains(logs.String(), errStoreDown.Error())):
				t.Errorf("log %q; want the warning %q with the store's error", logs.String(), warning)
			}
		})
	}
}

// movedMeanwhile is the in-memory store where, just before the first Claim
// of a key, another face's execution takes the key over, saves its own
// point ("other") and dies there; its own Yield fails with errStoreDown
// when failYield is set.
type movedMeanwhile struct {
	*idemmem.Store
	raced     atomic.Bool
	failYield atomic.Bool
}

func (s *movedMeanwhile) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if s.raced.CompareAndSwap(false, true) {
		other, err := s.Store.Claim(ctx, req)
		if err != nil || other.Outcome != idem.Acquired {
			return idem.Claim{}, fmt.Errorf("the other face's takeover: %v, %w", other.Outcome, err)
		}
		ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: other.Token}
		if err := s.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: "other"}); err != nil {
			return idem.Claim{}, err
		}
		if err := s.Store.Yield(ctx, ref); err != nil {
			return idem.Claim{}, err
		}
	}
	return s.Store.Claim(ctx, req)
}

func (s *movedMeanwhile) Yield(ctx context.Context, ref idem.Ref) error {
	if s.failYield.Load() {
		return errStoreDown
	}
	return s.Store.Yield(ctx, ref)
}

// A Settle that finds the key it read at its own point stopped at another
// face's point by the time it claims it refuses (ErrOtherPoint) and gives
// the key back as it is, point and all, its lease yielded, so that the
// other face's Completer resumes it at once. When giving it back fails, it
// says so in its log.
func TestSettleOfAKeyMovedToAnotherPointGivesItBack(t *testing.T) {
	t.Parallel()
	for _, failYield := range []bool{false, true} {
		t.Run(fmt.Sprintf("yield fails %v", failYield), func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			store := &movedMeanwhile{Store: idemmem.NewStore(&idemmem.Config{Clock: clock})}
			eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{"charging"},
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
				Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
					return idem.Response{}, errors.New("not resumed in this test")
				}})
			if err != nil {
				t.Fatal(err)
			}
			abandon(t, store.Store, "k")
			store.failYield.Store(failYield)
			_, err = comp.Settle(t.Context(), "", "k", idem.Response{Status: 409}, false)
			if !errors.Is(err, keyed.ErrOtherPoint) {
				t.Fatalf("Settle of a key moved to another point: %v; want ErrOtherPoint", err)
			}
			rec, err := store.Get(t.Context(), "", "k")
			if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "other" {
				t.Fatalf("the key after Settle: %v at %q, %v; want it in flight at the other point", rec.State, rec.Recovery.Name, err)
			}
			const warning = "could not give back a key it claimed anew"
			switch {
			case !failYield && rec.LeaseExpiresAt.After(clock.Now()):
				t.Errorf("the key's lease ends at %v, after now (%v); want it yielded", rec.LeaseExpiresAt, clock.Now())
			case !failYield && logs.Len() != 0:
				t.Errorf("warnings logged though the key was given back: %s", logs.String())
			case failYield && (!strings.Contains(logs.String(), warning) || !strings.Contains(logs.String(), errStoreDown.Error())):
				t.Errorf("log %q; want the warning %q with the store's error", logs.String(), warning)
			}
		})
	}
}

// A resume whose answer the store may or may not have kept (Complete
// failed without the store's answer) says the result is unknown, so that
// nobody records as failed a resume that may have finished the key; a
// resume whose own work failed says nothing of the kind.
func TestResumeThatCannotKeepItsAnswerSaysTheResultIsUnknown(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := &completeFails{Store: idemmem.NewStore(&idemmem.Config{Clock: clock})}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		if fail.Load() {
			return idem.Response{}, errors.New("the card network does not answer")
		}
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, store.Store, "k")
	store.fail.Store(true)
	_, err = comp.ResumeKey(t.Context(), "", "k", false)
	if !errors.Is(err, keyed.ErrResultUnknown) || !errors.Is(err, errStoreDown) {
		t.Fatalf("a resume whose answer the store failed to keep: %v; want ErrResultUnknown with the store's error", err)
	}
	store.fail.Store(false)

	abandon(t, store.Store, "k2")
	fail.Store(true)
	_, err = comp.ResumeKey(t.Context(), "", "k2", false)
	if err == nil || errors.Is(err, keyed.ErrResultUnknown) {
		t.Fatalf("a resume that failed at the network: %v; want its failure, not ErrResultUnknown (nothing was written)", err)
	}
	fail.Store(false)

	// A lost lease is the store's refusal, not a lost answer: another
	// holder has the key, which this resume certainly did not finish.
	lost := &completeLosesLease{Store: idemmem.NewStore(&idemmem.Config{Clock: clock})}
	eng2, err := keyed.New(&keyed.Config{Store: lost, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	comp2, err := eng2.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, lost.Store, "k3")
	_, err = comp2.ResumeKey(t.Context(), "", "k3", false)
	if !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, keyed.ErrResultUnknown) {
		t.Fatalf("a resume whose Complete lost its lease: %v; want ErrLeaseLost, not ErrResultUnknown", err)
	}
}

// completeLosesLease is a store whose Complete is refused: another holder
// took the key.
type completeLosesLease struct{ *idemmem.Store }

func (s *completeLosesLease) Complete(context.Context, idem.Ref, idem.Response) error {
	return idem.ErrLeaseLost
}

// yieldRefused is the in-memory store whose Yield fails with errStoreDown
// while fail is set.
type yieldRefused struct {
	*idemmem.Store
	fail atomic.Bool
}

func (s *yieldRefused) Yield(ctx context.Context, ref idem.Ref) error {
	if s.fail.Load() {
		return errStoreDown
	}
	return s.Store.Yield(ctx, ref)
}

// A resume that learned nothing was done outside (ErrNothingDone) records
// the release before it releases the key. When that record fails, the key
// is not released: it stays in flight at its point, its lease ended, for
// the next resume, and ResumeRecorded says ErrNotRecorded with the
// record's error. When giving the key back fails too, the error says so
// as well (the key then stays held until the resume's lease ends).
func TestResumeThatCannotRecordItsReleaseKeepsTheKey(t *testing.T) {
	t.Parallel()
	for _, failYield := range []bool{false, true} {
		t.Run(fmt.Sprintf("yield fails %v", failYield), func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			store := &yieldRefused{Store: idemmem.NewStore(&idemmem.Config{Clock: clock})}
			eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			comp, err := eng.NewCompleter(&keyed.CompleterConfig{
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError})),
				Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
					return idem.Response{}, keyed.ErrNothingDone
				}})
			if err != nil {
				t.Fatal(err)
			}
			abandon(t, store.Store, "k")
			store.fail.Store(failYield)
			errHistory := errors.New("the history cannot be written")
			var ends []keyed.ResumeEnd
			finished, err := comp.ResumeRecorded(t.Context(), "", "k", func(_ context.Context, _ bool, end keyed.ResumeEnd) error {
				ends = append(ends, end)
				return errHistory
			})
			if finished || !errors.Is(err, keyed.ErrNotRecorded) || !errors.Is(err, errHistory) {
				t.Fatalf("ResumeRecorded whose record of the release fails: %v, %v; want ErrNotRecorded with the record's error", finished, err)
			}
			if len(ends) != 1 || !ends[0].Released {
				t.Fatalf("records asked: %+v; want one, of the release", ends)
			}
			if failYield != errors.Is(err, errStoreDown) {
				t.Fatalf("ResumeRecorded's error: %v; the key could not be given back: %v", err, failYield)
			}
			rec, err := store.Get(t.Context(), "", "k")
			if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
				t.Fatalf("the key: %v at %q, %v; want it in flight at its point, not released", rec.State, rec.Recovery.Name, err)
			}
			if held := rec.LeaseExpiresAt.After(clock.Now()); held != failYield {
				t.Fatalf("the key's lease until %v (now %v): held %v; want it held only when it could not be given back", rec.LeaseExpiresAt, clock.Now(), held)
			}
			// The log says what became of the key, with every error.
			const givenBack, stillHeld = "the key is given back", "could not give the key back"
			line := logs.String()
			switch {
			case !strings.Contains(line, errHistory.Error()):
				t.Errorf("log %q; want the record's error %q", line, errHistory)
			case failYield && (strings.Contains(line, givenBack) || !strings.Contains(line, stillHeld) || !strings.Contains(line, errStoreDown.Error())):
				t.Errorf("log %q; want %q with the Yield's error, not %q", line, stillHeld, givenBack)
			case !failYield && (!strings.Contains(line, givenBack) || strings.Contains(line, stillHeld)):
				t.Errorf("log %q; want %q", line, givenBack)
			}
		})
	}
}

// releaseLost is the in-memory store whose ReleaseWithPoint gets no
// answer: the release is committed when commit is set, and the error is
// the same either way.
type releaseLost struct {
	*idemmem.Store
	commit bool
}

func (s *releaseLost) ReleaseWithPoint(ctx context.Context, ref idem.Ref) error {
	if s.commit {
		if err := s.Store.ReleaseWithPoint(ctx, ref); err != nil {
			return err
		}
	}
	return errStoreDown
}

// txAnswerLost is the in-memory store as an idem.TxStore whose CompleteTx
// commits (when commit is set) or not, and gets no answer either way.
type txAnswerLost struct {
	*idemmem.Store
	commit bool
}

func (s *txAnswerLost) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	resp, keep, err := work(ctx)
	if err != nil || !keep {
		return false, err
	}
	if s.commit {
		if err := s.Store.Complete(ctx, ref, resp); err != nil {
			return false, err
		}
	}
	return false, errStoreDown
}

// A resume whose last write got no answer (releasing the key after
// Resume found nothing done, or completing it in the transaction of its
// record) says ErrResultUnknown, and holds the key under its lease as a
// failed resume does, so that LetGo gives the lease back at once: the key
// is then in flight at its point, its lease ended, if the write was not
// committed, and as the write left it if it was (the Yield under the
// resume's token is refused, changing nothing).
func TestResumeWhoseLastWriteGotNoAnswerCanBeLetGo(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{false, true} {
		for _, write := range []string{"ReleaseWithPoint", "CompleteTx"} {
			t.Run(fmt.Sprintf("%s committed %v", write, commit), func(t *testing.T) {
				t.Parallel()
				clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
				mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
				var store idem.Store = &releaseLost{Store: mem, commit: commit}
				answer := idem.Response{}
				wantAfter := "absent"
				if write == "CompleteTx" {
					store, answer = &txAnswerLost{Store: mem, commit: commit}, idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}
					wantAfter = "completed"
				}
				if !commit {
					wantAfter = "in flight"
				}
				eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
					if answer.Status == 0 {
						return idem.Response{}, keyed.ErrNothingDone
					}
					return answer, nil
				}})
				if err != nil {
					t.Fatal(err)
				}
				abandon(t, mem, "k")
				var ends []string
				finished, err := comp.ResumeRecorded(t.Context(), "", "k", func(_ context.Context, inTx bool, end keyed.ResumeEnd) error {
					ends = append(ends, fmt.Sprintf("in tx %v, released %v, status %d", inTx, end.Released, end.Status))
					return nil
				})
				if finished || !errors.Is(err, keyed.ErrResultUnknown) || !errors.Is(err, errStoreDown) || errors.Is(err, keyed.ErrNotRecorded) {
					t.Fatalf("a resume whose %s got no answer: %v, %v; want ErrResultUnknown with the store's error", write, finished, err)
				}
				if len(ends) != 1 {
					t.Fatalf("records asked: %q; want one", ends)
				}
				if f := comp.Failures("", "k"); !f.Holding || f.Count != 1 {
					t.Fatalf("Failures after the unknown result: %+v; want one, holding the key under the resume's lease", f)
				}
				if err := comp.LetGo(t.Context(), "", "k"); err != nil {
					t.Fatalf("LetGo after the unknown result: %v", err)
				}
				if f := comp.Failures("", "k"); f.Holding {
					t.Fatalf("Failures after LetGo: %+v; want it no longer holding the key", f)
				}
				rec, err := mem.Get(t.Context(), "", "k")
				got := "absent"
				switch {
				case err == nil && rec.State == idem.StateCompleted:
					got = "completed"
				case err == nil && rec.State == idem.StateInFlight && rec.Recovery.Name == "charging" && !rec.LeaseExpiresAt.After(clock.Now()):
					got = "in flight"
				case err == nil:
					got = fmt.Sprintf("%v at %q, lease until %v", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
				case !errors.Is(err, idem.ErrNotFound):
					t.Fatal(err)
				}
				if got != wantAfter {
					t.Fatalf("the key after LetGo: %s; want %s", got, wantAfter)
				}
			})
		}
	}
}
