package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

var (
	keySecret = []byte("0123456789abcdef0123456789abcdef")
	bodyKeyA  = idemhttp.BodyKey{ID: "a", Key: bytes.Repeat([]byte{1}, 32)}
	bodyKeyB  = idemhttp.BodyKey{ID: "b", Key: bytes.Repeat([]byte{2}, 32)}
)

func tenantScope(r *http.Request) (idem.Scope, error) {
	return idem.Scope(r.Header.Get("X-Tenant")), nil
}

// Keys sealed with a secret never reach the store as they were sent, and
// everything a key does still works: replays, from this process and from
// another, mismatches, and scopes kept apart.
func TestKeySecretSealsKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		store := b.open(t, idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		var n atomic.Int64
		var seen atomic.Value
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ex, _ := idemhttp.ExecutionFromContext(r.Context())
			seen.Store(ex.Key)
			counter(&n).ServeHTTP(w, r)
		})
		cfg := idemhttp.Config{Store: store, Scope: tenantScope, KeySecret: keySecret}
		first := newMiddleware(t, cfg).Handler(h)
		other := newMiddleware(t, cfg).Handler(h) // another process: nothing recent

		r1 := do(t, first, "POST", "/pay", "order-1", `{"a":1}`, "X-Tenant", "t1")
		if r1.status != http.StatusCreated {
			t.Fatalf("first: %d %s", r1.status, r1.body)
		}
		sealed := idemhttp.SealKey(keySecret, "t1", "order-1")
		if got := seen.Load().(idem.Key); got != sealed {
			t.Fatalf("Execution.Key = %q, want the sealed key %q", got, sealed)
		}
		if !idemhttp.IsSealedKey(sealed) || idemhttp.IsSealedKey("order-1") {
			t.Fatalf("IsSealedKey(%q) or IsSealedKey(order-1) wrong", sealed)
		}
		if _, err := idem.ParseKey(string(sealed)); err != nil {
			t.Fatalf("a sealed key must be a valid key to pass downstream: %v", err)
		}
		if _, err := store.Get(context.Background(), "t1", "order-1"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("the key as sent is in the store: Get = %v", err)
		}
		if rec, err := store.Get(context.Background(), "t1", sealed); err != nil || rec.State != idem.StateCompleted {
			t.Fatalf("the sealed key: %+v, %v", rec, err)
		}
		for name, h := range map[string]http.Handler{"same process": first, "other process": other} {
			r := do(t, h, "POST", "/pay", "order-1", `{"a":1}`, "X-Tenant", "t1")
			if r.status != http.StatusCreated || r.body != r1.body || r.header.Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("%s: duplicate got %d %q (replayed %q), want the first answer %q", name, r.status, r.body, r.header.Get(idemhttp.HeaderReplayed), r1.body)
			}
			if r := do(t, h, "POST", "/pay", "order-1", `{"a":2}`, "X-Tenant", "t1"); r.status != http.StatusUnprocessableEntity {
				t.Fatalf("%s: another body under the key got %d, want 422", name, r.status)
			}
		}
		// The same key from another tenant is another key.
		if r := do(t, other, "POST", "/pay", "order-1", `{"a":2}`, "X-Tenant", "t2"); r.status != http.StatusCreated || r.header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("another tenant's key: %d %q", r.status, r.body)
		}
		if seen.Load().(idem.Key) == sealed {
			t.Fatal("two tenants' keys sealed alike")
		}
		// A client that sends a sealed key gets it sealed again: it never
		// addresses the record it names.
		if r := do(t, other, "POST", "/pay", string(sealed), `{"a":9}`, "X-Tenant", "t1"); r.status != http.StatusCreated || r.header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("a sealed key sent as a key: %d %q, want a new execution", r.status, r.body)
		}
		if got := n.Load(); got != 3 {
			t.Fatalf("%d executions, want 3", got)
		}
	})
}

// Bodies sealed with BodyKeys are not in the store in clear, replay as they
// were written, open after a key rotation, and refuse (500, nothing run
// again) when no configured key opens them.
func TestBodyKeysSealBodies(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		store := b.open(t, idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		var n atomic.Int64
		h := counter(&n)
		withA := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyA}}).Handler(h)
		r1 := do(t, withA, "POST", "/pay", "k1", `{}`)
		if r1.status != http.StatusCreated || r1.body != `{"execution":1}` {
			t.Fatalf("first: %d %q", r1.status, r1.body)
		}
		rec, err := store.Get(context.Background(), "", "k1")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(rec.Response.Body, []byte("execution")) {
			t.Fatalf("the store keeps the body in clear: %q", rec.Response.Body)
		}

		// Rotated: B seals from now on, A still opens.
		rotated := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyB, bodyKeyA}}).Handler(h)
		if r := do(t, rotated, "POST", "/pay", "k1", `{}`); r.status != http.StatusCreated || r.body != r1.body {
			t.Fatalf("replay after rotation: %d %q, want %q", r.status, r.body, r1.body)
		}
		r2 := do(t, rotated, "POST", "/pay", "k2", `{}`)
		// A body kept before encryption was turned on replays as it is.
		plain := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true}).Handler(h)
		r3 := do(t, plain, "POST", "/pay", "k3", `{}`)
		onlyB := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyB}}).Handler(h)
		if r := do(t, onlyB, "POST", "/pay", "k2", `{}`); r.status != http.StatusCreated || r.body != r2.body {
			t.Fatalf("replay with B: %d %q, want %q", r.status, r.body, r2.body)
		}
		if r := do(t, onlyB, "POST", "/pay", "k3", `{}`); r.status != http.StatusCreated || r.body != r3.body {
			t.Fatalf("replay of a body kept in clear: %d %q, want %q", r.status, r.body, r3.body)
		}
		// A is gone: k1's body cannot be opened, and k1 does not run again.
		before := n.Load()
		r := do(t, onlyB, "POST", "/pay", "k1", `{}`)
		if r.status != http.StatusInternalServerError || problemType(t, r) != idemhttp.ProblemAnswerUnreadable {
			t.Fatalf("replay without its key: %d %q, want 500 %s", r.status, r.body, idemhttp.ProblemAnswerUnreadable)
		}
		// Without any BodyKeys, a sealed body is refused the same way, never
		// sent as the ciphertext.
		if r := do(t, plain, "POST", "/pay", "k2", `{}`); r.status != http.StatusInternalServerError || strings.Contains(r.body, "idem-gcm") {
			t.Fatalf("sealed body without BodyKeys: %d %q", r.status, r.body)
		}
		if n.Load() != before {
			t.Fatal("an unreadable answer ran the request again")
		}
	})
}

// A sealed body is bound to its record: copied to another key, it does not
// open there.
func TestSealedBodyBoundToItsRecord(t *testing.T) {
	store := openSQLite(t, idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var n atomic.Int64
	m := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, BodyKeys: []idemhttp.BodyKey{bodyKeyA}, RecentKeys: -1})
	h := m.Handler(counter(&n))
	do(t, h, "POST", "/pay", "k1", `{}`)
	ctx := context.Background()
	rec1, err := store.Get(ctx, "", "k1")
	if err != nil {
		t.Fatal(err)
	}
	// k2 is kept with k1's sealed body, as a person with write access to
	// the store might try.
	claim, err := store.Claim(ctx, idem.ClaimRequest{Key: "k2", Fingerprint: rec1.Fingerprint, Lease: rec1.LeaseExpiresAt.Sub(rec1.CreatedAt), TTL: rec1.ExpiresAt.Sub(rec1.CreatedAt)})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim k2: %+v %v", claim, err)
	}
	if err := store.Complete(ctx, idem.Ref{Key: "k2", Token: claim.Token}, *rec1.Response); err != nil {
		t.Fatal(err)
	}
	if r := do(t, h, "POST", "/pay", "k2", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("a body moved to another record: %d %q, want 500", r.status, r.body)
	}
	if r := do(t, h, "POST", "/pay", "k1", `{}`); r.status != http.StatusCreated || r.body != `{"execution":1}` {
		t.Fatalf("its own record: %d %q", r.status, r.body)
	}
}

// DiscardBodies keeps status and headers only.
func TestDiscardBodies(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		store := b.open(t, idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		var n atomic.Int64
		h := newMiddleware(t, idemhttp.Config{Store: store, SharedScope: true, DiscardBodies: true}).Handler(counter(&n))
		if r := do(t, h, "POST", "/pay", "k1", `{}`); r.body != `{"execution":1}` {
			t.Fatalf("the first answer keeps its body: %q", r.body)
		}
		if rec, err := store.Get(context.Background(), "", "k1"); err != nil || len(rec.Response.Body) != 0 || !rec.Response.BodyOmitted {
			t.Fatalf("kept: %+v %v, want no body", rec.Response, err)
		}
		r := do(t, h, "POST", "/pay", "k1", `{}`)
		if r.status != http.StatusCreated || r.body != "" || r.header.Get(idemhttp.HeaderBodyOmitted) != "true" || r.header.Get("Location") != "/things/1" {
			t.Fatalf("replay: %d %q %v", r.status, r.body, r.header)
		}
	})
}

func TestAtRestConfigRefused(t *testing.T) {
	store := openSQLite(t, idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	for name, cfg := range map[string]idemhttp.Config{
		"short secret":  {KeySecret: []byte("short")},
		"short AES key": {BodyKeys: []idemhttp.BodyKey{{ID: "a", Key: make([]byte, 16)}}},
		"no ID":         {BodyKeys: []idemhttp.BodyKey{{Key: make([]byte, 32)}}},
		"ID with space": {BodyKeys: []idemhttp.BodyKey{{ID: "a b", Key: make([]byte, 32)}}},
		"ID twice":      {BodyKeys: []idemhttp.BodyKey{bodyKeyA, {ID: "a", Key: make([]byte, 32)}}},
	} {
		cfg.Store, cfg.SharedScope = store, true
		if _, err := idemhttp.New(&cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: New = %v, want ErrInvalidArgument", name, err)
		}
	}
}
