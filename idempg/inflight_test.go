package idempg_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// atPoints is what InFlightAtPoints and Abandoned list: a store's.
type atPoints interface {
	idem.Recoverer
	InFlightAtPoints(ctx context.Context, limit int) ([]idem.Record, error)
}

// InFlightAtPoints lists every key in flight with a recovery point,
// whether its holder's lease has ended (as Abandoned lists it) or not; a
// key without a point, and one completed, are not listed.
func TestInFlightAtPoints(t *testing.T) {
	t.Parallel()
	u := pgURL(t)
	testInFlightAtPoints(t, newStore(t, openDB(t, u, idempg.Config{})))
}

func testInFlightAtPoints(t *testing.T, s atPoints) {
	ctx := t.Context()
	claim := func(key idem.Key, point bool) idem.Ref {
		t.Helper()
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Hour, TTL: 24 * time.Hour})
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("claim %s: %v %v", key, c.Outcome, err)
		}
		ref := idem.Ref{Scope: "s", Key: key, Token: c.Token}
		if point {
			if err := s.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: "charging", Data: []byte("{}")}); err != nil {
				t.Fatal(err)
			}
		}
		return ref
	}
	gone := claim("gone", true)
	if err := s.Yield(ctx, gone); err != nil { // its holder's lease ended
		t.Fatal(err)
	}
	claim("held", true) // its holder lives
	claim("plain", false)
	if err := s.Complete(ctx, claim("done", true), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	keys := func(recs []idem.Record, err error) []idem.Key {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var out []idem.Key
		for _, r := range recs {
			if r.State != idem.StateInFlight || r.Recovery.Name != "charging" {
				t.Fatalf("listed %s: %s at %q", r.Key, r.State, r.Recovery.Name)
			}
			out = append(out, r.Key)
		}
		return out
	}
	if got := keys(s.InFlightAtPoints(ctx, 10)); !slices.Equal(got, []idem.Key{"gone", "held"}) {
		t.Fatalf("InFlightAtPoints: %v; want gone and held, the oldest lease end first", got)
	}
	if got := keys(s.InFlightAtPoints(ctx, 1)); !slices.Equal(got, []idem.Key{"gone"}) {
		t.Fatalf("InFlightAtPoints with limit 1: %v; want gone", got)
	}
	if got := keys(s.Abandoned(ctx, 10)); !slices.Equal(got, []idem.Key{"gone"}) {
		t.Fatalf("Abandoned: %v; want gone alone", got)
	}
	if _, err := s.InFlightAtPoints(ctx, 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("limit 0: %v; want an argument error", err)
	}
}
