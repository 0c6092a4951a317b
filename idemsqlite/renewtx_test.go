package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// A renewal made in the caller's transaction answers as one made alone: a
// holder's renewal returns the lease's new end, which the record shows once
// the transaction commits; a renewal under a token that no longer holds
// the key fails with idem.ErrLeaseLost, returns no end, and leaves the
// holder's lease as it was.
func TestRenewInCallersTx(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	s := newStore(t, db, nil)
	ctx := t.Context()
	req := idem.ClaimRequest{Scope: "merchant", Key: "order-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}

	var end time.Time
	if err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		end, err = s.Renew(ctx, ref, 10*time.Minute)
		return err
	}); err != nil {
		t.Fatalf("the holder's renewal in its transaction: %v", err)
	}
	if !end.After(c.Record.LeaseExpiresAt) {
		t.Fatalf("the renewal ends the lease at %v; want past the claim's end, %v", end, c.Record.LeaseExpiresAt)
	}
	rec, err := s.Get(ctx, req.Scope, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.LeaseExpiresAt.Equal(end) {
		t.Fatalf("the record's lease ends at %v; want the renewal's end, %v", rec.LeaseExpiresAt, end)
	}

	stale := ref
	stale.Token++
	if err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		got, err := s.Renew(ctx, stale, time.Hour)
		if !errors.Is(err, idem.ErrLeaseLost) || !got.IsZero() {
			t.Errorf("a renewal under a token that does not hold the key = %v, %v; want no end and idem.ErrLeaseLost", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, req.Scope, req.Key); err != nil || !rec.LeaseExpiresAt.Equal(end) {
		t.Fatalf("after a refused renewal the lease ends at %v (%v); want it unchanged, %v", rec.LeaseExpiresAt, err, end)
	}
}
