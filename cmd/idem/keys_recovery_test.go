package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// keys show names a key's recovery point, and an unknown outcome when its
// execution stopped there; keys abandoned lists such keys and exits 1.
func TestKeysShowsUnknownOutcomes(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "idem.db")
	dbURL := "sqlite:" + file
	db, err := idemsqlite.Open(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	// An hour ago by the store's clock: the lease has long ended by the
	// command's.
	clock := idemmem.NewClock(time.Now().Add(-time.Hour))
	store, err := idemsqlite.NewStore(t.Context(), db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCmd(t, "keys", "abandoned", "--db", dbURL); code != exitOK || !strings.Contains(out, "no abandoned executions") {
		t.Fatalf("keys abandoned of a store without any: exit %d, %q, %q", code, out, errOut)
	}
	c, err := store.Claim(t.Context(), idem.ClaimRequest{Scope: "acme", Key: "pay-1", Fingerprint: "fp", Lease: time.Second, TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SaveRecovery(t.Context(), idem.Ref{Scope: "acme", Key: "pay-1", Token: c.Token}, idem.RecoveryPoint{Name: "charging", Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	code, out, errOut := runCmd(t, "keys", "show", "--db", dbURL, "--scope", "acme", "pay-1")
	if code != exitOK {
		t.Fatalf("keys show: exit %d, %q", code, errOut)
	}
	for _, want := range []string{"in_flight", "recovery point", "charging", "unknown since", "never released"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys show lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = runCmd(t, "keys", "abandoned", "--db", dbURL)
	if code != exitFailure || !strings.Contains(out, "pay-1") || !strings.Contains(out, "charging") || !strings.Contains(errOut, "1 executions stopped") {
		t.Fatalf("keys abandoned: exit %d, stdout %q, stderr %q; want 1 listing pay-1", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "keys", "abandoned", "--db", dbURL, "--limit", "0"); code != exitUsage {
		t.Fatalf("keys abandoned --limit 0: exit %d, %q; want a usage error", code, errOut)
	}
}
