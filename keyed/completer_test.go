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
