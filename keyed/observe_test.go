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
