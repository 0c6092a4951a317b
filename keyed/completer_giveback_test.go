package keyed_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// givingBack is a store that reports the deadlines a round gave its
// listing and the writes that give a key back (Release, Yield), and can
// release a key between its listing and its claim, as a client's retry
// that found its holder's lease ended and Resume's nothing done would.
type givingBack struct {
	*idemmem.Store
	releaseFirst bool

	mu       sync.Mutex
	listing  time.Time
	gaveBack map[string]time.Time // by the write's name
	released bool
}

func (s *givingBack) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.listing = d
	s.mu.Unlock()
	return s.Store.Abandoned(ctx, limit)
}

func (s *givingBack) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	s.mu.Lock()
	first := s.releaseFirst && !s.released
	s.released = true
	s.mu.Unlock()
	if first {
		rec, err := s.Store.Get(ctx, req.Scope, req.Key)
		if err != nil {
			return idem.Claim{}, err
		}
		if err := s.Store.ReleaseWithPoint(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: rec.Token}); err != nil {
			return idem.Claim{}, err
		}
	}
	return s.Store.Claim(ctx, req)
}

func (s *givingBack) note(write string, ctx context.Context) {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.gaveBack[write] = d
	s.mu.Unlock()
}

func (s *givingBack) Release(ctx context.Context, ref idem.Ref) error {
	s.note("Release", ctx)
	return s.Store.Release(ctx, ref)
}

func (s *givingBack) Yield(ctx context.Context, ref idem.Ref) error {
	s.note("Yield", ctx)
	return s.Store.Yield(ctx, ref)
}

// A round's writes that give a key back without resuming it (the Release
// of a key released since it was listed and claimed anew, the Yield of a
// key whose point cannot be opened) are inside the round's Timeout, as
// its listing, its claims and its resumes are: the round's resumes end
// within Timeout of its start (the Completer's Bound, and what Run waits
// for as it stops), not a write's own time later.
func TestCompleterRoundGivesKeysBackWithinItsTimeout(t *testing.T) {
	t.Parallel()
	data := []byte(`{"charge":"ch_1"}`)
	sealed, err := keyed.ResealPoint([]keyed.BodyKey{bodyKey1}, "", "k", "k", "charging", data)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, write  string
		releaseFirst bool
		point        []byte
		keys         []keyed.BodyKey
	}{
		{name: "a key released since it was listed", write: "Release", releaseFirst: true},
		{name: "a point it cannot open", write: "Yield", point: sealed, keys: []keyed.BodyKey{bodyKey2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
			claim, err := mem.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: idem.NewFingerprint("POST", "/pay", "", "", []byte("k")),
				Lease: 12 * time.Second, TTL: time.Hour})
			if err != nil || claim.Outcome != idem.Acquired {
				t.Fatalf("claim: %v, %v", claim.Outcome, err)
			}
			ref := idem.Ref{Key: "k", Token: claim.Token}
			if err := mem.SaveRecovery(t.Context(), ref, idem.RecoveryPoint{Name: "charging", Data: c.point}); err != nil {
				t.Fatal(err)
			}
			if err := mem.Yield(t.Context(), ref); err != nil {
				t.Fatal(err)
			}
			store := &givingBack{Store: mem, releaseFirst: c.releaseFirst, gaveBack: map[string]time.Time{}}
			eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour,
				BodyKeys: c.keys})
			if err != nil {
				t.Fatal(err)
			}
			// Shorter than a write's own time (detached's ten seconds).
			comp, err := eng.NewCompleter(&keyed.CompleterConfig{Timeout: 2 * time.Second,
				Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
					t.Error("resumed a key it should have given back")
					return idem.Response{Status: 201}, nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := comp.RunOnce(t.Context()); n != 0 || err != nil {
				t.Fatalf("RunOnce = %d, %v; want none finished, no error", n, err)
			}
			store.mu.Lock()
			listing := store.listing
			gave, ok := store.gaveBack[c.write]
			store.mu.Unlock()
			if !ok {
				t.Fatalf("the round made no %s; want the key given back", c.write)
			}
			if listing.IsZero() || gave.IsZero() || gave.After(listing) {
				t.Errorf("the round's %s had the deadline %s, its listing %s: want it within the round's Timeout, by the listing's deadline",
					c.write, gave.Format(time.RFC3339Nano), listing.Format(time.RFC3339Nano))
			}
		})
	}
}
