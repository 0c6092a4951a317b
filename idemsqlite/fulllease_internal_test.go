package idemsqlite

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// A claim that waited for its group's commit at most a hundredth of its
// lease returns with the lease its claim wrote, not renewed (the package
// documentation's "less at most a hundredth of it": a negligible wait
// costs no write); one that waited longer has its lease renewed, counted
// from when it returns.
func TestClaimLeaseRenewedOnlyAfterWaitingMoreThanAHundredthOfIt(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	clock := &handClock{now: t0}
	s, err := NewStore(t.Context(), groupDB(t, 0), &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	claim, err := s.Claim(t.Context(), req)
	if err != nil || claim.Outcome != idem.Acquired || !claim.Record.LeaseExpiresAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("Claim = %+v, %v; want acquired with its lease ending at %v", claim, err, t0.Add(time.Second))
	}
	leaseEnd := func() time.Time {
		t.Helper()
		rec, err := s.Get(t.Context(), "s", "k")
		if err != nil {
			t.Fatal(err)
		}
		return rec.LeaseExpiresAt
	}

	clock.set(t0.Add(req.Lease / 100))
	got, err := s.fullLease(t.Context(), req, claim)
	if want := t0.Add(time.Second); err != nil || !got.Record.LeaseExpiresAt.Equal(want) || !leaseEnd().Equal(want) {
		t.Fatalf("after a wait of exactly a hundredth of the lease: lease to %v (stored %v), %v; want it as claimed, to %v",
			got.Record.LeaseExpiresAt, leaseEnd(), err, want)
	}

	back := t0.Add(req.Lease/100 + time.Nanosecond)
	clock.set(back)
	got, err = s.fullLease(t.Context(), req, claim)
	if want := back.Add(time.Second); err != nil || !got.Record.LeaseExpiresAt.Equal(want) || !leaseEnd().Equal(want) {
		t.Fatalf("after a wait just past a hundredth of the lease: lease to %v (stored %v), %v; want it renewed from the return, to %v",
			got.Record.LeaseExpiresAt, leaseEnd(), err, want)
	}
}
