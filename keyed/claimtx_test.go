package keyed_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// memClaimTx is the in-memory store with a ClaimTx of its own, for the
// engine's ClaimTx form: it claims with Claim and runs work; it completes
// the key with work's answer when work keeps one, and releases it
// otherwise (the in-memory store has no transaction to roll back). With
// failCommit set, a claim that acquired the key is answered with that
// error and work does not run: a store whose commit failed after the claim
// was written, the claim committed.
type memClaimTx struct {
	*idemmem.Store
	failCommit error
}

func (*memClaimTx) CompleteTx(context.Context, idem.Ref, idem.TxWork) (bool, error) {
	return false, errors.New("not used")
}

func (s *memClaimTx) ClaimTx(ctx context.Context, req idem.ClaimRequest, _ time.Duration, work idem.ClaimedWork) (idem.Claim, bool, error) {
	claim, err := s.Claim(ctx, req)
	if err != nil || claim.Outcome != idem.Acquired {
		return claim, false, err
	}
	if s.failCommit != nil {
		return claim, false, s.failCommit
	}
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	resp, keep, err := work(ctx, claim)
	if err != nil || !keep {
		return claim, false, errors.Join(err, s.Release(ctx, ref))
	}
	return claim, true, s.Complete(ctx, ref, resp)
}

// The handler's context ends once its request is answered, in the ClaimTx
// form as in the others: whatever the handler left watching it (a
// goroutine, a call under way) stops then, not at the engine's Timeout.
func TestClaimTxHandlerContextEndsWithTheRequest(t *testing.T) {
	t.Parallel()
	eng, err := keyed.New(&keyed.Config{Store: &memClaimTx{Store: idemmem.NewStore(nil)}, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !eng.ClaimsInTx() {
		t.Fatal("the engine does not claim in the store's transaction")
	}
	var (
		mu      sync.Mutex
		handled context.Context
	)
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("k"))
	o := eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: fp}, &funcFace{run: func(ctx context.Context) keyed.Ran {
		if err := ctx.Err(); err != nil {
			t.Errorf("the handler's context ended before the handler returned: %v", err)
		}
		mu.Lock()
		handled = ctx
		mu.Unlock()
		return keyed.Ran{Status: 200, Keep: true, Answer: idem.Response{Status: 200}}
	}})
	if o != keyed.OutcomeExecuted {
		t.Fatalf("outcome %v, want executed", o)
	}
	mu.Lock()
	defer mu.Unlock()
	if err := handled.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("the handler's context after the request was answered: Err %v, want %v", err, context.Canceled)
	}
}

// A ClaimTx whose claim acquired the key and whose commit then failed,
// the work not run, may have committed the claim: the engine asks the
// store which, and a key left in flight under its claim is released, so
// that a retry runs at once instead of waiting for the lease to end.
func TestClaimTxCommittedClaimWithoutWorkIsReleased(t *testing.T) {
	t.Parallel()
	mem := idemmem.NewStore(nil)
	eng, err := keyed.New(&keyed.Config{Store: &memClaimTx{Store: mem, failCommit: errors.New("commit: connection reset by peer")}, Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("k"))
	f := &funcFace{run: func(context.Context) keyed.Ran {
		t.Error("the handler ran, though the store's transaction failed before its work")
		return keyed.Ran{}
	}}
	if o := eng.Serve(context.Background(), keyed.Request{Key: "k", Fingerprint: fp}, f); o != keyed.OutcomeStoreError {
		t.Fatalf("outcome %v, want %v", o, keyed.OutcomeStoreError)
	}
	if f.refused == 0 {
		t.Error("the request was not refused")
	}
	rec, err := mem.Get(context.Background(), "", "k")
	if !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("the key after the failed commit: %v %v, %v; want it released (%v), not in flight under its hour's lease", rec.State, rec.Token, err, idem.ErrNotFound)
	}
}
