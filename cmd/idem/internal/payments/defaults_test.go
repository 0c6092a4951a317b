package payments

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem/idemsqlite"
)

// A TTL set shorter than the default lease lowers the lease instead of
// refusing a configuration that never set one; a lease set longer than the
// TTL is still refused.
func TestShortTTLLowersTheDefaultLease(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "ttl.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	keys := map[string]string{"k": "acme"}
	svc, err := New(t.Context(), &Config{DB: db, APIKeys: keys, KeyTTL: 4 * time.Second, RequestsOnly: true})
	if err != nil {
		t.Fatalf("KeyTTL 4s alone: %v", err)
	}
	svc.Close()
	_, err = New(t.Context(), &Config{DB: db, APIKeys: keys, KeyTTL: 4 * time.Second, KeyLease: time.Minute, RequestsOnly: true})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("KeyLease 1m over KeyTTL 4s: %v, want ErrConfig", err)
	}
}
