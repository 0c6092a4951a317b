package payments_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
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
		// Made as a version that kept the client's key in the payments'
		// origin: the rows hold the keys themselves.
		execSQL(t, e, b, `UPDATE payments SET idempotency_key = CASE amount WHEN 100 THEN 'before-1' ELSE 'before-2' END`)

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

// execSQL runs a statement on e's database, as a version before this one
// or an operator would have.
func execSQL(t *testing.T, e *env, b backend, q string) {
	t.Helper()
	var err error
	if b == onSQLite || b == onSQLiteRedis {
		_, err = e.cfg.DB.Writer().ExecContext(context.Background(), q)
	} else {
		_, err = e.cfg.Postgres.Pool().Exec(context.Background(), q)
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// column reads one text column of every row q selects on e's database.
func column(t *testing.T, e *env, b backend, q string) []string {
	t.Helper()
	var out []string
	if b == onSQLite || b == onSQLiteRedis {
		rows, err := e.cfg.DB.Reader().QueryContext(context.Background(), q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		for rows.Next() {
			var v string
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	rows, err := e.cfg.Postgres.Pool().Query(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Without a key secret the service still keeps no client's key in its own
// tables: the payments', deposits' and refunds' origins are digests of
// tenant and key.
func TestOriginsKeepNoClientKeyWithoutSecret(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		pay := e.expect(req{method: "POST", path: "/v1/payments", idemKey: "client-pay-1", body: payBody(acct.ID, 100, "KRW")}, http.StatusCreated)
		e.expect(req{method: "POST", path: "/v1/accounts/" + acct.ID + "/deposits", idemKey: "client-dep-1", body: `{"amount":50}`}, http.StatusCreated)
		p := decode[payment](t, pay)
		e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "client-ref-1", body: refundBody(p.ID, 40)}, http.StatusCreated)
		for _, table := range []string{"payments", "deposits", "refunds"} {
			keys := column(t, e, b, `SELECT idempotency_key FROM `+table+` WHERE idempotency_key IS NOT NULL`)
			if len(keys) != 1 {
				t.Fatalf("%s: %d origins, want 1", table, len(keys))
			}
			if strings.Contains(keys[0], "client-") || !strings.HasPrefix(keys[0], "idg1_") {
				t.Errorf("%s keeps the origin %q, want a digest (idg1_…), not the client's key", table, keys[0])
			}
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 10_000-100+50+40)
	})
}

// A payment recorded by a version that kept the client's key in its
// origin is still found by a retry whose claim the key store lost: the
// look-up matches the key as it was kept as well as its digest.
func TestLostClaimFindsAnOriginKeptInClear(t *testing.T) {
	forEachBackend(t, []backend{onSQLiteRedis, onPostgresRedis}, func(t *testing.T, b backend) {
		e := newEnvClocked(t, b, nil, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		key := "legacy-origin-" + rand.Text()
		first := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: key, body: payBody(acct.ID, 700, "KRW")}, http.StatusCreated))
		execSQL(t, e, b, `UPDATE payments SET idempotency_key = '`+key+`'`)
		forgetRedisKeys(t, key)
		again := decode[payment](t, e.replica().expect(req{method: "POST", path: "/v1/payments", idemKey: key, body: payBody(acct.ID, 700, "KRW")}, http.StatusCreated))
		if again.ID != first.ID {
			t.Fatalf("the retry after a lost claim made payment %s; the first, kept under the key in clear, is %s", again.ID, first.ID)
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 10_000-700)
	})
}

// The payments' descriptions and the refunds' reasons are sealed with the
// body keys: by the service as it writes them, and by SealKeys for those
// kept in clear before; SealKeys seals again with a new first key (a
// rotation), after which the old key can go. Reads open them.
func TestSealKeysSealsTextsAndRotates(t *testing.T) {
	t.Parallel()
	secret := bytes.Repeat([]byte("s"), 32)
	k1 := idemhttp.BodyKey{ID: "k1", Key: bytes.Repeat([]byte{1}, 32)}
	k2 := idemhttp.BodyKey{ID: "k2", Key: bytes.Repeat([]byte{2}, 32)}
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		p := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: "t-1", body: payBody(acct.ID, 100, "KRW")}, http.StatusCreated))
		e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "t-2", body: refundBody(p.ID, 10)}, http.StatusCreated)
		texts := func() string {
			return strings.Join(append(column(t, e, b, `SELECT description FROM payments`), column(t, e, b, `SELECT reason FROM refunds`)...), "|")
		}
		if got := texts(); got != "coffee|requested_by_customer" {
			t.Fatalf("texts kept without body keys: %q", got)
		}
		seal := func(keys ...idemhttp.BodyKey) int {
			t.Helper()
			var n payments.SealedKeys
			var err error
			if b == onSQLite {
				n, err = payments.SealKeys(context.Background(), e.cfg.DB, secret, keys)
			} else {
				n, err = payments.SealKeysPostgres(context.Background(), e.cfg.Postgres, secret, keys)
			}
			if err != nil {
				t.Fatalf("SealKeys: %v", err)
			}
			return n.Texts
		}
		if n := seal(k1); n != 2 {
			t.Fatalf("sealed %d texts, want 2", n)
		}
		if got := texts(); strings.Contains(got, "coffee") || strings.Contains(got, "requested_by_customer") {
			t.Fatalf("texts kept after sealing: %q", got)
		}
		if n := seal(k1); n != 0 {
			t.Fatalf("a second run sealed %d texts, want 0", n)
		}
		read := func(keys ...idemhttp.BodyKey) *env {
			t.Helper()
			e.cfg.KeySecret, e.cfg.BodyKeys = secret, keys
			r := e.replica()
			if got := decode[payment](t, r.expect(req{method: "GET", path: "/v1/payments/" + p.ID}, http.StatusOK)); got.Description != "coffee" {
				t.Fatalf("description read with %v: %q", keys, got.Description)
			}
			return r
		}
		read(k1)
		// A rotation: k2 first; SealKeys seals every text with it, and k1
		// is not needed any more.
		if n := seal(k2, k1); n != 2 {
			t.Fatalf("the rotation sealed %d texts again, want 2", n)
		}
		r := read(k2)
		// k1 alone opens none of them now: the read fails, and says so.
		e.cfg.BodyKeys = []idemhttp.BodyKey{k1}
		if got := e.replica().do(req{method: "GET", path: "/v1/payments/" + p.ID}); got.status < 500 || strings.Contains(string(got.body), "coffee") {
			t.Fatalf("a description read with a key that does not open it: %s; want a 5xx", got)
		}
		e.cfg.BodyKeys = []idemhttp.BodyKey{k2}
		// New rows are sealed as they are written, and read back.
		p2 := decode[payment](t, r.expect(req{method: "POST", path: "/v1/payments", idemKey: "t-3",
			body: `{"account_id":"` + acct.ID + `","amount":5,"currency":"KRW","description":"tea-at-noon"}`}, http.StatusCreated))
		if got := decode[payment](t, r.expect(req{method: "GET", path: "/v1/payments/" + p2.ID}, http.StatusOK)); got.Description != "tea-at-noon" {
			t.Fatalf("a new payment's description reads %q", got.Description)
		}
		if got := texts(); strings.Contains(got, "tea-at-noon") {
			t.Fatalf("a new payment's description is kept in clear: %q", got)
		}
		list := r.expectPayments(keyA, acct.ID, 2)
		for _, lp := range list {
			if lp.Description != "coffee" && lp.Description != "tea-at-noon" {
				t.Fatalf("a listed payment's description reads %q", lp.Description)
			}
		}
	})
}
