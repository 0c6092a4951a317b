package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsqlite"
)

// Reconcile with --keys reads the keys in flight under --keys-prefix: a
// prefix under which no key of the store lives at all (not the one 'idem
// serve' was given, or another Redis database) shows none in flight, as a
// database without the key store does, and reconcile says so, on stderr
// and in the --json summary ("keys_seen": false), naming the prefix,
// rather than read it as a service with no key in flight. Once a key lives
// under it, the keys are seen, and nothing is said.
func TestReconcileOfARedisPrefixWithoutKeys(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = payments.Migrate(t.Context(), db)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	rd := redisURL(t)
	prefix := freshPrefix(t, rd)
	hs := startCardNetwork(t)
	reconcile := func() (int, string, string) {
		return runCmd(t, "reconcile", "--db", "sqlite:"+path, "--keys", rd, "--keys-prefix", prefix,
			"--acquirer", hs.URL, "--acquirer-key", "net-key", "--json")
	}
	code, out, errOut := reconcile()
	if code != exitOK || !strings.Contains(out, `"keys_seen":false`) || !strings.Contains(out, `"keys_in":"redis"`) ||
		!strings.Contains(errOut, "cannot see the keys in flight") || !strings.Contains(errOut, prefix) || !strings.Contains(errOut, "--keys-prefix") {
		t.Fatalf("reconcile of a prefix without keys: exit %d, %q, %q; want exit 0, keys_seen false, and a word naming the prefix", code, out, errOut)
	}

	s, err := idemredis.Open(t.Context(), rd, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Claim(t.Context(), idem.ClaimRequest{Scope: "acme", Key: "deposit-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	if err := s.Complete(t.Context(), idem.Ref{Scope: "acme", Key: "deposit-1", Token: c.Token}, idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = reconcile()
	if code != exitOK || !strings.Contains(out, `"keys_seen":true`) || strings.Contains(errOut, "cannot see") {
		t.Fatalf("reconcile of a prefix holding a completed key: exit %d, %q, %q; want exit 0, keys_seen true, nothing said", code, out, errOut)
	}
}
