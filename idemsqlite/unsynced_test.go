package idemsqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// TestClaimLeavesWriterSynced: claims commit without a sync, and the
// writer connection is handed back synchronous=FULL every time, so the
// commits that must be durable (completions, business writes) stay durable.
func TestClaimLeavesWriterSynced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := idemsqlite.NewStore(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	synchronous := func() int {
		t.Helper()
		var v int
		if err := db.Writer().QueryRowContext(ctx, "PRAGMA synchronous").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	req := idem.ClaimRequest{Key: "k", Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if got := synchronous(); got != 2 {
		t.Fatalf("writer synchronous = %d after a claim, want 2 (FULL)", got)
	}
	// A claim whose context is cancelled half-way still restores it.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Claim(cctx, idem.ClaimRequest{Key: "k2", Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour}); err == nil {
		t.Fatal("claim with a cancelled context succeeded")
	}
	if got := synchronous(); got != 2 {
		t.Fatalf("writer synchronous = %d after a cancelled claim, want 2 (FULL)", got)
	}
	// A claim inside a caller's transaction joins it.
	err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: "k3", Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour})
		if err == nil && c.Outcome != idem.Acquired {
			t.Errorf("joined claim: %+v", c)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "", "k3"); err != nil {
		t.Fatalf("joined claim not committed with its transaction: %v", err)
	}
}
