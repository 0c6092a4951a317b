package keyed_test

import (
	"context"
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
