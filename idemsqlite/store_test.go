package idemsqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// openDB opens a fresh database file in a temporary directory, closed when
// the test ends.
func openDB(t *testing.T) *idemsqlite.DB {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return db
}

func newStore(t *testing.T, db *idemsqlite.DB, clock idem.Clock) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.NewStore(t.Context(), db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
