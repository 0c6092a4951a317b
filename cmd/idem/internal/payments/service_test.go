package payments

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

func TestPurgeExpiredDeletesInBatches(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "purge.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var now atomic.Int64
	now.Store(time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := idem.ClockFunc(func() time.Time { return time.Unix(0, now.Load()).UTC() })

	svc, err := New(context.Background(), &Config{DB: db, APIKeys: map[string]string{"k": "t"}, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	h := svc.Handler()
	post := func(path, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	acct := post("/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	if acct.Code != http.StatusCreated {
		t.Fatalf("create account: %d %s", acct.Code, acct.Body)
	}
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	const keys = 5
	for i := range keys {
		w := post("/v1/payments", fmt.Sprintf("key-%d", i), `{"account_id":"`+id+`","amount":1,"currency":"KRW"}`)
		if w.Code != http.StatusCreated {
			t.Fatalf("payment %d: %d %s", i, w.Code, w.Body)
		}
	}

	if n, err := svc.purgeExpired(context.Background(), 2); err != nil || n != 0 {
		t.Fatalf("purge before expiry = %d, %v; want 0", n, err)
	}
	now.Add(int64(DefaultKeyTTL + time.Second))
	if n, err := svc.purgeExpired(context.Background(), 2); err != nil || n != keys {
		t.Fatalf("purge after expiry = %d, %v; want %d", n, err, keys)
	}
	if n, err := svc.purgeExpired(context.Background(), 2); err != nil || n != 0 {
		t.Fatalf("second purge = %d, %v; want 0", n, err)
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := svc.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestMigrateIsRepeatable(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "migrate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for range 2 {
		if err := Migrate(context.Background(), db); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	var n int
	if err := db.Reader().QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('accounts', 'payments', 'deposits')`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("tables after Migrate: %d, %v; want 3", n, err)
	}
	if err := Migrate(context.Background(), nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("Migrate(nil) = %v, want ErrConfig", err)
	}
}
