package pgsql

import (
	"io/fs"
	"slices"
	"testing"

	"github.com/idem-go/idem/internal/sqlmigrate"
)

// The migrations are well formed, and named as the databases that ran them
// recorded them: a file renumbered or removed would run again, or never, on
// a schema an earlier version migrated.
func TestMigrations(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		fsys  fs.FS
		files []string
	}{
		"keys":     {Keys, []string{"0001_create_idem_keys.sql", "0002_drop_state_check.sql", "0003_claim_in_one_write.sql", "0004_recovery_points.sql"}},
		"waiters":  {Waiters, []string{"0001_create_idem_waiters.sql"}},
		"messages": {Messages, []string{"0001_create_messages.sql", "0002_create_inbox_sequences.sql"}},
	} {
		list, err := sqlmigrate.List(c.fsys)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		for _, f := range list {
			got = append(got, f.Name)
		}
		if !slices.Equal(got[:len(c.files)], c.files) {
			t.Errorf("%s migrations = %v; the first ones must stay %v", name, got, c.files)
		}
	}
}

// The advisory lock keys are what every version of idempg and idempgsql
// computes: processes of two versions migrating one schema at once must
// take the same lock.
func TestLockKeyIsStable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		schema, component string
		want              int64
	}{
		{"idem", "", 4500371732570398515},
		{"idem", KeysComponent, 5304266595167050540},
		{"public", MessagesComponent, -614498741490061180},
	} {
		if got := LockKey(c.schema, c.component); got != c.want {
			t.Errorf("LockKey(%q, %q) = %d, want %d", c.schema, c.component, got, c.want)
		}
	}
}
