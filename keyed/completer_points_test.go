package keyed_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// A Completer that names its points (CompleterConfig.Points) leaves a key
// abandoned at another point alone, in its rounds and in ResumeKey: it is
// the other face's Completer's to finish, in its own form.
func TestCompleterTakesOnlyItsPoints(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var resumed []idem.Key
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{"charging-elsewhere"},
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			resumed = append(resumed, ex.Key)
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, store, "other") // at "charging"
	if n, err := comp.RunOnce(t.Context()); n != 0 || err != nil || len(resumed) != 0 {
		t.Fatalf("RunOnce = %d, %v, resumed %v; want the key at another point left alone", n, err, resumed)
	}
	if _, err := comp.ResumeKey(t.Context(), "", "other", false); err == nil {
		t.Fatal("ResumeKey of a key at another point: no error")
	}
	if rec, err := store.Get(t.Context(), "", "other"); err != nil || rec.State != idem.StateInFlight || len(resumed) != 0 {
		t.Fatalf("the key: %v, %v, resumed %v; want it in flight, untouched", rec.State, err, resumed)
	}
}

// A round that goes on past keys at other points still takes on no more
// than Limit keys of its own: the rest wait for the next round, as they
// would with no other point in the store.
func TestCompleterRoundTakesNoMoreThanLimitOfItsOwn(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var resumed []idem.Key
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{"mine"}, Limit: 2, Parallel: 1,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			resumed = append(resumed, ex.Key)
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	// Listed in this order (oldest lease end first): the first list of
	// Limit keys holds one of the Completer's own, the next one three.
	for _, k := range []struct{ key, point string }{{"other", "other"}, {"mine-1", "mine"}, {"mine-2", "mine"}, {"mine-3", "mine"}} {
		abandonAt(t, store, idem.Key(k.key), k.point)
		clock.Advance(time.Second)
	}
	if n, err := comp.RunOnce(t.Context()); n != 2 || err != nil || !slices.Equal(resumed, []idem.Key{"mine-1", "mine-2"}) {
		t.Fatalf("RunOnce = %d, %v, resumed %v; want the first two keys of its own (Limit 2)", n, err, resumed)
	}
	for _, k := range []idem.Key{"other", "mine-3"} {
		if rec, err := store.Get(t.Context(), "", k); err != nil || rec.State != idem.StateInFlight {
			t.Fatalf("%s: %v, %v; want it in flight, untouched", k, rec.State, err)
		}
	}
}

// abandonAt leaves key in flight at point with its lease ended, as a
// holder that died there would.
func abandonAt(t *testing.T, store *idemmem.Store, key idem.Key, point string) {
	t.Helper()
	ctx := t.Context()
	claim, err := store.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", []byte(key)),
		Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim %s: %v, %v", key, claim.Outcome, err)
	}
	ref := idem.Ref{Key: key, Token: claim.Token}
	if err := store.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: point}); err != nil {
		t.Fatal(err)
	}
	if err := store.Yield(ctx, ref); err != nil {
		t.Fatal(err)
	}
}

// Settle, like ResumeKey, refuses a key stopped at a point outside the
// Completer's Points, dry run or not, and changes nothing: the answer it
// would keep is in this face's form, which the other face's retries could
// not read.
func TestSettleRefusesAKeyAtAnotherPoint(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{"charging"},
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			t.Errorf("Resume ran for %q", ex.Key)
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandonAt(t, store, "grpc", "charging-grpc")
	before, err := store.Get(t.Context(), "", "grpc")
	if err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		_, err := comp.Settle(t.Context(), "", "grpc", idem.Response{Status: 502, Body: []byte("settled")}, dry)
		if !errors.Is(err, keyed.ErrOtherPoint) {
			t.Fatalf("Settle (dry run %v) of a key at another point = %v; want ErrOtherPoint", dry, err)
		}
		t.Logf("Settle (dry run %v): %v", dry, err)
	}
	after, err := store.Get(t.Context(), "", "grpc")
	if err != nil || after.State != idem.StateInFlight || after.Token != before.Token || after.Recovery.Name != "charging-grpc" ||
		!after.LeaseExpiresAt.Equal(before.LeaseExpiresAt) {
		t.Fatalf("the key after a refused Settle: %+v, %v; want it as before: %+v", after, err, before)
	}
	if _, err := comp.ResumeKey(t.Context(), "", "grpc", true); !errors.Is(err, keyed.ErrOtherPoint) {
		t.Fatalf("ResumeKey of a key at another point = %v; want ErrOtherPoint", err)
	}
}

// Keys abandoned at other points that fill a round's Limit do not starve
// the Completer: a round goes on past them to its own.
func TestCompleterRoundsGoPastOtherPoints(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var resumed []idem.Key
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{"mine"}, Limit: 2, Parallel: 1,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			resumed = append(resumed, ex.Key)
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	// The other face's keys are abandoned first, so they are listed first.
	abandonAt(t, store, "other-1", "other")
	clock.Advance(time.Second)
	abandonAt(t, store, "other-2", "other")
	clock.Advance(time.Second)
	abandonAt(t, store, "mine", "mine")
	clock.Advance(time.Second)
	if n, err := comp.RunOnce(t.Context()); n != 1 || err != nil || len(resumed) != 1 || resumed[0] != "mine" {
		t.Fatalf("RunOnce = %d, %v, resumed %v; want the key at its own point resumed past two at another", n, err, resumed)
	}
	for _, k := range []idem.Key{"other-1", "other-2"} {
		if rec, err := store.Get(t.Context(), "", k); err != nil || rec.State != idem.StateInFlight {
			t.Fatalf("%s: %v, %v; want it in flight, untouched", k, rec.State, err)
		}
	}
}
