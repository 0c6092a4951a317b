package idemsqlite

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// A Renew whose context ends as its transaction relaxes the writer's
// synchronous setting fails with the context's error, and leaves the
// writer connection open and synchronous=FULL: a heartbeat's short
// deadline that ends there costs no reopening of the writer. The writer's
// connection carries a temporary table, which a reopened one lacks.
func TestRenewEndingAsItRelaxesKeepsTheWriter(t *testing.T) {
	t.Parallel()
	db, err := Open(filepath.Join(t.TempDir(), "relax.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clock := &handClock{now: time.Unix(1_800_000_000, 0).UTC()}
	store, err := NewStore(t.Context(), db, &StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", claim, err)
	}
	ref := idem.Ref{Scope: "s", Key: "k", Token: claim.Token}
	if _, err := db.writer.ExecContext(t.Context(), `CREATE TEMP TABLE writer_mark (x)`); err != nil {
		t.Fatal(err)
	}

	// A heartbeat's deadline, which ends there.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db.testHookRelax = cancel
	_, err = store.Renew(ctx, ref, time.Second)
	db.testHookRelax = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Renew whose context ended as it relaxed the writer = %v, want context.Canceled", err)
	}

	if _, err := store.Renew(t.Context(), ref, time.Second); err != nil {
		t.Fatalf("the next Renew: %v", err)
	}
	var n, synchronous int
	if err := db.writer.QueryRowContext(t.Context(), `SELECT count(*) FROM temp.writer_mark`).Scan(&n); err != nil {
		t.Fatalf("the writer was reopened: %v", err)
	}
	if err := db.writer.QueryRowContext(t.Context(), `PRAGMA synchronous`).Scan(&synchronous); err != nil || synchronous != 2 {
		t.Fatalf("writer synchronous = %d, %v; want 2 (FULL)", synchronous, err)
	}
}
