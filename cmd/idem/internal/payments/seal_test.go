package payments_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
)

// A service that ran with keys in clear is migrated to sealed keys by
// SealKeys: afterwards the keys and the payments' origins are kept sealed
// only, and a duplicate of a payment made before is still replayed, not
// charged again.
func TestSealKeysMigratesAServiceInClear(t *testing.T) {
	secret := bytes.Repeat([]byte("s"), 32)
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		first := e.expect(req{method: "POST", path: "/v1/payments", idemKey: "before-1", body: payBody(acct.ID, 100, "KRW")}, http.StatusCreated)
		e.expect(req{method: "POST", path: "/v1/payments", idemKey: "before-2", body: payBody(acct.ID, 200, "KRW")}, http.StatusCreated)

		seal := func() payments.SealedKeys {
			t.Helper()
			var n payments.SealedKeys
			var err error
			if b == onSQLite {
				n, err = payments.SealKeys(context.Background(), e.cfg.DB, secret, nil)
			} else {
				n, err = payments.SealKeysPostgres(context.Background(), e.cfg.Postgres, secret, nil)
			}
			if err != nil {
				t.Fatalf("SealKeys: %v", err)
			}
			return n
		}
		n := seal()
		if n.Payments != 2 || n.Keys < 2 {
			t.Fatalf("sealed %+v, want 2 payments and their 2 keys at least", n)
		}
		if again := seal(); again != (payments.SealedKeys{}) {
			t.Fatalf("a second run sealed %+v, want nothing", again)
		}
		ctx := context.Background()
		if _, err := e.keys.Get(ctx, tenantA, "before-1"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("the key in clear is still kept: %v", err)
		}
		if _, err := e.keys.Get(ctx, tenantA, idemhttp.SealKey(secret, tenantA, "before-1")); err != nil {
			t.Fatalf("the sealed key: %v", err)
		}

		e.cfg.KeySecret = secret
		r := e.replica()
		dup := r.expect(req{method: "POST", path: "/v1/payments", idemKey: "before-1", body: payBody(acct.ID, 100, "KRW")}, http.StatusCreated)
		if !bytes.Equal(dup.body, first.body) || dup.header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("duplicate after sealing: %s (replayed %q), want the first answer %s", dup, dup.header.Get(idemhttp.HeaderReplayed), first)
		}
		r.expect(req{method: "POST", path: "/v1/payments", idemKey: "after-1", body: payBody(acct.ID, 300, "KRW")}, http.StatusCreated)
		r.expectPayments(keyA, acct.ID, 3)
		r.expectBalance(keyA, acct.ID, 10_000-100-200-300)
		if _, err := e.keys.Get(ctx, tenantA, "after-1"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("a new key is kept in clear: %v", err)
		}
	})
}

func TestSealKeysRefusesAShortSecret(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := payments.SealKeys(context.Background(), e.cfg.DB, []byte("short"), nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("SealKeys with a short secret = %v, want ErrInvalidArgument", err)
	}
}
