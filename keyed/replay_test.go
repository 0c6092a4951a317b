package keyed_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// replayFace answers with a fixed answer when run, and keeps what the
// engine made of the request: how often the handler ran, the replay it was
// given, the refusal.
type replayFace struct {
	runs      int
	replayed  *idem.Response
	replayErr error // what Replay returns
	refusal   *keyed.Refusal
}

func (f *replayFace) Run(context.Context, bool) keyed.Ran {
	f.runs++
	return keyed.Ran{Status: 201, Keep: true, Answer: idem.Response{Status: 201, Body: []byte(`{"id":1}`)}}
}
func (f *replayFace) Send() {}
func (f *replayFace) Replay(resp *idem.Response) error {
	if f.replayErr != nil {
		return f.replayErr
	}
	f.replayed = resp
	return nil
}
func (f *replayFace) Refuse(r keyed.Refusal) { f.refusal = &r }

// opsAndEnds is an Observer that records the round trips to the store and
// the phases ended, with what each ended with.
type opsAndEnds struct {
	mu   sync.Mutex
	ops  []keyed.StoreOp
	ends []keyed.Event
}

func (o *opsAndEnds) Begin(ctx context.Context, e keyed.Event) context.Context { return ctx }
func (o *opsAndEnds) End(_ context.Context, e keyed.Event) {
	o.mu.Lock()
	o.ends = append(o.ends, e)
	o.mu.Unlock()
}
func (o *opsAndEnds) Store(_ context.Context, op keyed.StoreOp, _ time.Duration, _ error) {
	o.mu.Lock()
	o.ops = append(o.ops, op)
	o.mu.Unlock()
}

func (o *opsAndEnds) reset() {
	o.mu.Lock()
	o.ops, o.ends = nil, nil
	o.mu.Unlock()
}

// end returns the last End of phase p.
func (o *opsAndEnds) end(t *testing.T, p keyed.Phase) keyed.Event {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.ends) - 1; i >= 0; i-- {
		if o.ends[i].Phase == p {
			return o.ends[i]
		}
	}
	t.Fatalf("no %s phase ended; ends %v", p, o.ends)
	return keyed.Event{}
}

// replayerStore is an idem.Replayer over the memory store: Replay answers
// from the key's record, as a store that reads it in one round trip does.
type replayerStore struct {
	*idemmem.Store
	fail    error // what Replay fails with, when set
	replays int
}

func (s *replayerStore) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	s.replays++
	if s.fail != nil {
		return nil, false, s.fail
	}
	rec, err := s.Get(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case rec.Fingerprint != fp:
		return nil, true, nil
	case rec.State != idem.StateCompleted:
		return nil, false, nil
	}
	return rec.Response, false, nil
}

// newReplayEngine is an engine that remembers the keys it completed but
// keeps no answer in memory, so that every duplicate of one reads the
// store.
func newReplayEngine(t *testing.T, store idem.Store, obs keyed.Observer) *keyed.Engine {
	t.Helper()
	eng, err := keyed.New(&keyed.Config{Store: store, Observer: obs, MemoryReplayFor: -1})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func serveObserved(t *testing.T, eng *keyed.Engine, key idem.Key, fp idem.Fingerprint, face keyed.Face) keyed.Outcome {
	t.Helper()
	ctx := eng.Begin(t.Context(), nil)
	defer eng.End(ctx)
	return eng.Serve(ctx, keyed.Request{Key: key, Fingerprint: fp}, face)
}

var (
	payFP     = idem.NewFingerprint("POST", "/pay", "", "", []byte(`{"amount":5}`))
	payMoreFP = idem.NewFingerprint("POST", "/pay", "", "", []byte(`{"amount":50}`))
)

// A duplicate of a key this process completed lately is answered with one
// read of the store (Get, the store being no Replayer): the kept answer,
// without a claim, and the handler does not run again.
func TestRecentKeyDuplicateReplayedFromOneRead(t *testing.T) {
	t.Parallel()
	obs := &opsAndEnds{}
	eng := newReplayEngine(t, idemmem.NewStore(nil), obs)
	first := &replayFace{}
	if o := serveObserved(t, eng, "k", payFP, first); o != keyed.OutcomeExecuted || first.runs != 1 {
		t.Fatalf("first request: %s, ran %d times; want executed once", o, first.runs)
	}
	obs.reset()
	dup := &replayFace{}
	if o := serveObserved(t, eng, "k", payFP, dup); o != keyed.OutcomeReplayed {
		t.Fatalf("duplicate: %s; want replayed", o)
	}
	if dup.runs != 0 || dup.refusal != nil || dup.replayed == nil || dup.replayed.Status != 201 || string(dup.replayed.Body) != `{"id":1}` {
		t.Fatalf("duplicate: ran %d, refused %v, replayed %+v; want the kept 201 replayed", dup.runs, dup.refusal, dup.replayed)
	}
	if want := []keyed.StoreOp{keyed.StoreGet}; !slices.Equal(obs.ops, want) {
		t.Fatalf("the duplicate's round trips: %v; want %v (one read, no claim)", obs.ops, want)
	}
	if ev := obs.end(t, keyed.PhaseReplay); ev.Status != 201 || ev.Err != nil {
		t.Fatalf("PhaseReplay ended with status %d, err %v; want 201, nil", ev.Status, ev.Err)
	}
	if ev := obs.end(t, keyed.PhaseRequest); ev.Outcome != keyed.OutcomeReplayed || ev.Status != 201 {
		t.Fatalf("PhaseRequest ended with %s, status %d; want replayed, 201", ev.Outcome, ev.Status)
	}
}

// The same key with another request, once the key is known completed, is
// refused as a mismatch from the one read, naming the key completed; the
// handler does not run and nothing is claimed.
func TestRecentKeyOtherRequestRefusedFromOneRead(t *testing.T) {
	t.Parallel()
	obs := &opsAndEnds{}
	eng := newReplayEngine(t, idemmem.NewStore(nil), obs)
	if o := serveObserved(t, eng, "k", payFP, &replayFace{}); o != keyed.OutcomeExecuted {
		t.Fatalf("first request: %s; want executed", o)
	}
	obs.reset()
	other := &replayFace{}
	if o := serveObserved(t, eng, "k", payMoreFP, other); o != keyed.OutcomeMismatch {
		t.Fatalf("another request with the key: %s; want mismatch", o)
	}
	if other.runs != 0 || other.refusal == nil || other.refusal.Reason != keyed.RefusedMismatch || other.refusal.State != idem.StateCompleted {
		t.Fatalf("another request: ran %d, refusal %+v; want refused as a mismatch with a completed key", other.runs, other.refusal)
	}
	if want := []keyed.StoreOp{keyed.StoreGet}; !slices.Equal(obs.ops, want) {
		t.Fatalf("its round trips: %v; want %v (one read, no claim)", obs.ops, want)
	}
}

// When the read of a key seen completed lately fails, or finds the key
// gone, the request is claimed as any other: a failing read neither
// refuses it nor runs it twice.
func TestRecentKeyReadFailingOrGoneLeftToTheClaim(t *testing.T) {
	t.Parallel()
	t.Run("gone", func(t *testing.T) {
		obs := &opsAndEnds{}
		clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		store := idemmem.NewStore(&idemmem.Config{Clock: clock})
		eng, err := keyed.New(&keyed.Config{Store: store, Observer: obs, MemoryReplayFor: -1, Clock: clock, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if o := serveObserved(t, eng, "k", payFP, &replayFace{}); o != keyed.OutcomeExecuted {
			t.Fatalf("first request: %s; want executed", o)
		}
		// The record expires and is purged: the key is anew.
		clock.Advance(2 * time.Hour)
		if _, err := store.Purge(t.Context(), 10); err != nil {
			t.Fatal(err)
		}
		obs.reset()
		again := &replayFace{}
		if o := serveObserved(t, eng, "k", payFP, again); o != keyed.OutcomeExecuted || again.runs != 1 {
			t.Fatalf("the key gone: %s, ran %d; want it claimed and executed", o, again.runs)
		}
		if want := []keyed.StoreOp{keyed.StoreGet, keyed.StoreClaim, keyed.StoreComplete}; !slices.Equal(obs.ops, want) {
			t.Fatalf("its round trips: %v; want %v", obs.ops, want)
		}
	})
	t.Run("replayer fails", func(t *testing.T) {
		obs := &opsAndEnds{}
		store := &replayerStore{Store: idemmem.NewStore(nil)}
		eng := newReplayEngine(t, store, obs)
		if o := serveObserved(t, eng, "k", payFP, &replayFace{}); o != keyed.OutcomeExecuted {
			t.Fatalf("first request: %s; want executed", o)
		}
		store.fail = errors.New("connection refused")
		obs.reset()
		dup := &replayFace{}
		if o := serveObserved(t, eng, "k", payFP, dup); o != keyed.OutcomeReplayed || dup.runs != 0 {
			t.Fatalf("duplicate after a failed Replay: %s, ran %d; want replayed from the claim", o, dup.runs)
		}
		if want := []keyed.StoreOp{keyed.StoreReplay, keyed.StoreClaim}; !slices.Equal(obs.ops, want) {
			t.Fatalf("its round trips: %v; want %v", obs.ops, want)
		}
	})
}

// A store that is an idem.Replayer answers a duplicate of a key seen
// completed lately with its Replay, not Get: the kept answer, or a mismatch
// for another request.
func TestRecentKeyAnsweredByTheStoresReplay(t *testing.T) {
	t.Parallel()
	obs := &opsAndEnds{}
	store := &replayerStore{Store: idemmem.NewStore(nil)}
	eng := newReplayEngine(t, store, obs)
	if o := serveObserved(t, eng, "k", payFP, &replayFace{}); o != keyed.OutcomeExecuted {
		t.Fatalf("first request: %s; want executed", o)
	}
	obs.reset()
	dup := &replayFace{}
	if o := serveObserved(t, eng, "k", payFP, dup); o != keyed.OutcomeReplayed || dup.runs != 0 || dup.replayed == nil || dup.replayed.Status != 201 {
		t.Fatalf("duplicate: %s, ran %d, replayed %+v; want the kept 201 replayed", o, dup.runs, dup.replayed)
	}
	if want := []keyed.StoreOp{keyed.StoreReplay}; !slices.Equal(obs.ops, want) || store.replays != 1 {
		t.Fatalf("its round trips: %v, %d Replay; want %v", obs.ops, store.replays, want)
	}
	obs.reset()
	other := &replayFace{}
	if o := serveObserved(t, eng, "k", payMoreFP, other); o != keyed.OutcomeMismatch || other.runs != 0 {
		t.Fatalf("another request with the key: %s, ran %d; want mismatch", o, other.runs)
	}
	if other.refusal == nil || other.refusal.Reason != keyed.RefusedMismatch || other.refusal.State != idem.StateCompleted {
		t.Fatalf("its refusal: %+v; want a mismatch with a completed key", other.refusal)
	}
	if want := []keyed.StoreOp{keyed.StoreReplay}; !slices.Equal(obs.ops, want) {
		t.Fatalf("its round trips: %v; want %v", obs.ops, want)
	}
}

// A kept answer the face cannot read is a store error and a refusal as
// unreadable: the handler is not run again (its effect happened), and the
// key keeps its answer.
func TestUnreadableKeptAnswerRefusedNotRunAgain(t *testing.T) {
	t.Parallel()
	obs := &opsAndEnds{}
	store := idemmem.NewStore(nil)
	eng := newReplayEngine(t, store, obs)
	if o := serveObserved(t, eng, "k", payFP, &replayFace{}); o != keyed.OutcomeExecuted {
		t.Fatalf("first request: %s; want executed", o)
	}
	obs.reset()
	unreadable := errors.New("answer kept by another face")
	dup := &replayFace{replayErr: unreadable}
	if o := serveObserved(t, eng, "k", payFP, dup); o != keyed.OutcomeStoreError {
		t.Fatalf("duplicate: %s; want a store error", o)
	}
	if dup.runs != 0 || dup.refusal == nil || dup.refusal.Reason != keyed.RefusedUnreadable || !errors.Is(dup.refusal.Err, unreadable) {
		t.Fatalf("duplicate: ran %d, refusal %+v; want refused as unreadable with the face's error", dup.runs, dup.refusal)
	}
	if ev := obs.end(t, keyed.PhaseReplay); ev.Status != 500 || !errors.Is(ev.Err, unreadable) {
		t.Fatalf("PhaseReplay ended with status %d, err %v; want 500 and the face's error", ev.Status, ev.Err)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("the key after: %+v, %v; want it still completed", rec, err)
	}
}

// A kept answer sealed with a body key is replayed opened: the duplicate
// gets the body the handler wrote, while the store holds it sealed.
func TestSealedKeptAnswerReplayedOpened(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	eng, err := keyed.New(&keyed.Config{Store: store, MemoryReplayFor: -1, BodyKeys: []keyed.BodyKey{bodyKey1}})
	if err != nil {
		t.Fatal(err)
	}
	if o := eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: payFP}, &replayFace{}); o != keyed.OutcomeExecuted {
		t.Fatalf("first request: %s; want executed", o)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.Response == nil || !keyed.IsSealedData(rec.Response.Body) {
		t.Fatalf("the kept answer: %+v, %v; want its body sealed", rec.Response, err)
	}
	for _, from := range []string{"a read of the record", "the claim"} {
		dup := &replayFace{}
		if o := eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: payFP}, dup); o != keyed.OutcomeReplayed || dup.replayed == nil || string(dup.replayed.Body) != `{"id":1}` {
			t.Fatalf("duplicate answered from %s: %s, replayed %+v; want the body opened", from, o, dup.replayed)
		}
		// The next duplicate is claimed: a fresh engine has not seen the key.
		if eng, err = keyed.New(&keyed.Config{Store: store, MemoryReplayFor: -1, BodyKeys: []keyed.BodyKey{bodyKey1}}); err != nil {
			t.Fatal(err)
		}
	}
}

// An answer without a body (a 204) is kept without one under body keys
// too: there is nothing to hide, and a sealed empty body would add a nonce
// and a tag to every such record. Its duplicates replay it, empty.
func TestEmptyKeptAnswerIsNotSealed(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	cfg := &keyed.Config{Store: store, MemoryReplayFor: -1, BodyKeys: []keyed.BodyKey{bodyKey1}}
	eng, err := keyed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	face := &funcFace{run: func(context.Context) keyed.Ran {
		return keyed.Ran{Status: 204, Keep: true, Answer: idem.Response{Status: 204}}
	}}
	if o := eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: payFP}, face); o != keyed.OutcomeExecuted {
		t.Fatalf("first request: %s; want executed", o)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.Response == nil || rec.Response.Status != 204 || len(rec.Response.Body) != 0 {
		t.Fatalf("the kept answer: %+v, %v; want a 204 kept with no body", rec.Response, err)
	}
	dup := &replayFace{}
	if o := eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: payFP}, dup); o != keyed.OutcomeReplayed || dup.replayed == nil || dup.replayed.Status != 204 || len(dup.replayed.Body) != 0 {
		t.Fatalf("duplicate: %s, replayed %+v; want the 204 replayed, empty", o, dup.replayed)
	}
}
