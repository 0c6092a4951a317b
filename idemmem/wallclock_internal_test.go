package idemmem

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// The store decides its leases by the wall-clock reading of its Clock's
// times, as idemsqlite, which keeps them as wall-clock nanoseconds, does,
// and as keyed counts a lease of an idem.LocalClock store: kept with the
// system clock's monotonic reading, a lease would end for the store on the
// monotonic clock, and a step of the wall clock backward would let keyed
// (counting on the wall clock) renew it only after the store had ended it.
func TestLeaseEndsAreKeptOnTheWallClock(t *testing.T) {
	t.Parallel()
	if !strings.Contains(time.Now().String(), " m=") {
		t.Skip("skipping: this platform's clock gives no monotonic reading")
	}
	monotonic := func(t time.Time) bool { return strings.Contains(t.String(), " m=") }
	ctx := context.Background()
	s := NewStore(nil) // the system clock
	claim, err := s.Claim(ctx, idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("Claim: %v, %v", claim.Outcome, err)
	}
	for name, at := range map[string]time.Time{"the claim's lease end": claim.Record.LeaseExpiresAt,
		"the claim's creation": claim.Record.CreatedAt, "the claim's expiry": claim.Record.ExpiresAt} {
		if monotonic(at) {
			t.Errorf("%s %v carries a monotonic reading; want the wall clock's alone", name, at)
		}
	}
	ref := idem.Ref{Key: "k", Token: claim.Token}
	end, err := s.Renew(ctx, ref, time.Minute)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if monotonic(end) {
		t.Errorf("the renewed lease's end %v carries a monotonic reading; want the wall clock's alone", end)
	}
	rec, err := s.Get(ctx, "", "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if monotonic(rec.LeaseExpiresAt) || !rec.LeaseExpiresAt.Equal(end) {
		t.Errorf("the kept lease end %v; want %v, on the wall clock alone", rec.LeaseExpiresAt, end.Round(0))
	}
}
