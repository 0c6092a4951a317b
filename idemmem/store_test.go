package idemmem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func TestNewDefaultsToSystemClock(t *testing.T) {
	t.Parallel()
	s := idemmem.NewStore(nil)
	before := time.Now()
	c, err := s.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Record.CreatedAt; got.Before(before) || got.After(time.Now()) {
		t.Errorf("CreatedAt = %v, want the wall clock around %v", got, before)
	}
}

func TestPurgeRefusesNonPositiveLimit(t *testing.T) {
	t.Parallel()
	s := idemmem.NewStore(nil)
	for _, limit := range []int{0, -1} {
		if _, err := s.Purge(t.Context(), limit); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Purge(%d) = %v, want ErrInvalidArgument", limit, err)
		}
	}
}

// Tokens must keep increasing for a key that was released, even when the
// clock steps back (an NTP correction): a late holder of the old token
// would otherwise be mistaken for the new one.
func TestTokensIncreaseWhenClockStepsBack(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(start)
	s := idemmem.NewStore(&idemmem.Config{Clock: clock})
	ctx := t.Context()
	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Minute}
	var last idem.Token
	for i := range 5 {
		c, err := s.Claim(ctx, req)
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("claim %d = %v, %v; want acquired", i, c.Outcome, err)
		}
		if c.Token <= last {
			t.Fatalf("claim %d: token %d is not greater than %d", i, c.Token, last)
		}
		last = c.Token
		if err := s.Release(ctx, idem.Ref{Key: req.Key, Token: c.Token}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(-time.Hour)
	}
}

func TestWaitChangeReturnsAtOnceWhenNotHeld(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(start)
	s := idemmem.NewStore(&idemmem.Config{Clock: clock})
	ctx := t.Context()
	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Minute}

	// A context with no deadline: if WaitChange blocked, the test would
	// hang and the test binary's timeout would report it.
	if err := s.WaitChange(ctx, "", "absent"); err != nil {
		t.Errorf("WaitChange on an absent key = %v", err)
	}
	c, err := s.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := s.WaitChange(ctx, "", "k"); err != nil {
		t.Errorf("WaitChange on a key whose lease ended = %v", err)
	}
	if err := s.Complete(ctx, idem.Ref{Key: "k", Token: c.Token}, idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitChange(ctx, "", "k"); err != nil {
		t.Errorf("WaitChange on a completed key = %v", err)
	}
}
