package main

import (
	"strings"
	"testing"
)

// keys settle refuses a reason longer than the console's, as a usage
// error, before it opens the database.
func TestKeysSettleRefusesAnOverlongReason(t *testing.T) {
	t.Parallel()
	code, _, errOut := runCmd(t, "keys", "settle", "--db", "sqlite:"+t.TempDir()+"/none.db", "--scope", "acme", "--operator", "alice",
		"pay-1", "--failed", "--reason", strings.Repeat("é", 501))
	if code != exitUsage || !strings.Contains(errOut, "at most 500 characters") {
		t.Fatalf("an overlong reason: exit %d, %q; want a usage error", code, errOut)
	}
}
