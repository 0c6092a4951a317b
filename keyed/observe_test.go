package keyed_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// commitLost is a TxStore whose transactions never commit, with an error
// that does not say whether they did (a connection reset at COMMIT).
type commitLost struct{ *idemmem.Store }

func (commitLost) CompleteTx(context.Context, idem.Ref, idem.TxWork) (bool, error) {
	return false, errors.New("read tcp: connection reset by peer")
}

// storeOps is an Observer that records the round trips to the store.
type storeOps struct {
	mu  sync.Mutex
	ops []keyed.StoreOp
}

func (o *storeOps) Begin(ctx context.Context, e keyed.Event) context.Context { return ctx }
func (o *storeOps) End(context.Context, keyed.Event)                         {}
func (o *storeOps) Store(_ context.Context, op keyed.StoreOp, _ time.Duration, _ error) {
	o.mu.Lock()
	o.ops = append(o.ops, op)
	o.mu.Unlock()
}

// After a commit whose outcome is unknown, the engine asks the store what
// happened and releases the key it still holds: the Observer sees those
// round trips too, as it sees a release after a transient failure.
func TestObserverSeesTheStoreAskedAfterAnAmbiguousCommit(t *testing.T) {
	t.Parallel()
	obs := &storeOps{}
	store := commitLost{idemmem.NewStore(nil)}
	eng, err := keyed.New(&keyed.Config{Store: store, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	face := &funcFace{run: func(ctx context.Context) keyed.Ran {
		return keyed.Ran{Status: 201, Keep: true, Answer: idem.Response{Status: 201}}
	}}
	ctx := eng.Begin(t.Context(), nil)
	o := eng.Serve(ctx, keyed.Request{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", nil)}, face)
	eng.End(ctx)
	if o != keyed.OutcomeStoreError || face.refused != keyed.RefusedCommitFailed {
		t.Fatalf("outcome %s, refused %s; want a store error, commit failed", o, face.refused)
	}
	if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the key after the failed commit: %v; want it released", err)
	}
	want := []keyed.StoreOp{keyed.StoreClaim, keyed.StoreComplete, keyed.StoreGet, keyed.StoreRelease}
	if !slices.Equal(obs.ops, want) {
		t.Fatalf("the Observer saw %v; want %v", obs.ops, want)
	}
}

// The Observer's PhaseHandler ends with the handler's failure as its Err
// ("handler " and Ran.Failure), and with no Err when the handler answered:
// what a trace marks as an error span.
func TestObserverSeesTheHandlersFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ran     keyed.Ran
		wantErr string
	}{
		{keyed.Ran{Status: 201, Keep: true, Answer: idem.Response{Status: 201}}, ""},
		{keyed.Ran{Status: 500, Failure: "panicked: out of cards"}, "handler panicked: out of cards"},
	} {
		obs := &opsAndEnds{}
		eng, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil), SeparateTx: true, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		ctx := eng.Begin(t.Context(), nil)
		eng.Serve(ctx, keyed.Request{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", nil)},
			&funcFace{run: func(context.Context) keyed.Ran { return tc.ran }})
		eng.End(ctx)
		got := obs.end(t, keyed.PhaseHandler)
		if gotErr := fmt.Sprint(got.Err); (got.Err == nil) != (tc.wantErr == "") || (got.Err != nil && gotErr != tc.wantErr) {
			t.Errorf("a handler that ran %+v: PhaseHandler ended with Err %v; want %q (none when empty)", tc.ran, got.Err, tc.wantErr)
		}
	}
}

// A request the face refused before the engine (Reject) is seen by the
// Observer with its scope and key, as the store would keep the key, when
// the face had read them; refused without a key, with neither.
func TestObserverSeesARejectedRequestsKey(t *testing.T) {
	t.Parallel()
	obs := &opsAndEnds{}
	eng, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil), Observer: obs, KeySecret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key        idem.Key
		wantScope  idem.Scope
		wantSealed bool
	}{
		{"k", "tenant", true},
		{"", "", false},
	} {
		ctx := eng.Begin(t.Context(), nil)
		eng.Reject(ctx, "tenant", tc.key)
		eng.End(ctx)
		got := obs.end(t, keyed.PhaseRequest)
		wantKey := idem.Key("")
		if tc.wantSealed {
			wantKey = eng.SealKey("tenant", tc.key)
		}
		if got.Outcome != keyed.OutcomeRejected || got.Scope != tc.wantScope || got.Key != wantKey {
			t.Errorf("Reject of key %q: the request ended %s with scope %q, key %q; want rejected, %q, %q", tc.key, got.Outcome, got.Scope, got.Key, tc.wantScope, wantKey)
		}
	}
}
