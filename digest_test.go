package idem_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

// digestPattern is the printed form of a key digest: 64 bits of HMAC.
var digestPattern = regexp.MustCompile(`^hmac:[0-9a-f]{16}$`)

// unkeyedPrefixes are what an unsalted SHA-256 of s looks like in a log,
// in the old form and as the same number of hex characters as a digest:
// anyone can compute them, so neither may ever be logged.
func unkeyedPrefixes(s string) []string {
	sum := sha256.Sum256([]byte(s))
	return []string{hex.EncodeToString(sum[:6]), hex.EncodeToString(sum[:8])}
}

const (
	helperEnv       = "IDEM_KEY_DIGEST_HELPER"
	helperSecretEnv = "IDEM_KEY_DIGEST_HELPER_SECRET"
)

// TestKeyDigestHelperProcess is not a test: it is the other process of
// TestKeyDigestDiffersAcrossProcesses, and prints the digest of one key.
func TestKeyDigestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	if secret := os.Getenv(helperSecretEnv); secret != "" {
		if err := idem.SetKeyDigestSecret([]byte(secret)); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("digest=%s\n", idem.Key("pay-0001").LogValue())
}

// digestInProcess runs the test binary again and returns the digest it
// logs for the key.
func digestInProcess(t *testing.T, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeyDigestHelperProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), helperEnv+"=1"), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "digest="); ok {
			return d
		}
	}
	t.Fatalf("helper process printed no digest:\n%s", out)
	return ""
}

// TestKeyDigestDiffersAcrossProcesses: by default each process draws its
// own secret, so the digest of one key in one process says nothing about
// the digest of that key in another; replicas given one secret agree.
func TestKeyDigestDiffersAcrossProcesses(t *testing.T) {
	t.Parallel()
	a, b := digestInProcess(t), digestInProcess(t)
	for _, d := range []string{a, b} {
		if !digestPattern.MatchString(d) {
			t.Errorf("digest %q is not hmac: and 16 hex characters", d)
		}
		for _, p := range unkeyedPrefixes("pay-0001") {
			if strings.Contains(d, p) {
				t.Errorf("digest %q is the unkeyed SHA-256 of the key", d)
			}
		}
	}
	if a == b {
		t.Errorf("two processes logged the key as the same %q: the digest is not keyed per process", a)
	}
	const shared = helperSecretEnv + "=replicas-share-this-secret"
	if c, d := digestInProcess(t, shared), digestInProcess(t, shared); c != d {
		t.Errorf("two processes with one secret logged the key as %q and %q", c, d)
	}
}

// wantDigest is the documented digest, computed apart from the package:
// HMAC-SHA-256 of a tag byte and each field preceded by its length as 8
// big-endian bytes, 64 bits of it in hex.
func wantDigest(secret []byte, tag byte, fields ...string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte{tag})
	for _, f := range fields {
		mac.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		mac.Write([]byte(f))
	}
	return "hmac:" + hex.EncodeToString(mac.Sum(nil)[:8])
}

// TestSetKeyDigestSecret changes the process's secret, so it does not run
// in parallel: parallel tests start only once it has finished, and see
// digests that stay put.
func TestSetKeyDigestSecret(t *testing.T) {
	const key idem.Key = "pay-0001"
	byDefault := key.LogValue().String()
	if !digestPattern.MatchString(byDefault) {
		t.Fatalf("default digest %q is not hmac: and 16 hex characters", byDefault)
	}
	for _, p := range unkeyedPrefixes(string(key)) {
		if strings.Contains(byDefault, p) {
			t.Fatalf("default digest %q is the unkeyed SHA-256 of the key", byDefault)
		}
	}

	// Too short: refused, and nothing changes.
	for _, short := range [][]byte{nil, []byte("fifteen-bytes!!")} {
		err := idem.SetKeyDigestSecret(short)
		var ae *idem.ArgumentError
		if !errors.As(err, &ae) || !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "at least 16") {
			t.Errorf("SetKeyDigestSecret(%d bytes) = %v, want an *ArgumentError asking for 16 bytes", len(short), err)
		}
		if got := key.LogValue().String(); got != byDefault {
			t.Errorf("a refused secret changed the digest from %q to %q", byDefault, got)
		}
	}

	// Exactly 16 bytes, the documented minimum: accepted.
	if err := idem.SetKeyDigestSecret([]byte("sixteen-bytes!!!")); err != nil {
		t.Errorf("SetKeyDigestSecret(16 bytes) = %v, want it accepted", err)
	}

	secretA := []byte("replica-secret-number-one")
	secretB := []byte("replica-secret-number-two")
	if err := idem.SetKeyDigestSecret(secretA); err != nil {
		t.Fatal(err)
	}
	underA := key.LogValue().String()
	if want := wantDigest(secretA, 'K', string(key)); underA != want {
		t.Errorf("LogValue under secret A = %q, want %q", underA, want)
	}
	if want := wantDigest(secretA, 'S', "tenant-7", string(key)); idem.KeyDigest("tenant-7", key) != want {
		t.Errorf("KeyDigest under secret A = %q, want %q", idem.KeyDigest("tenant-7", key), want)
	}
	secretA[0] ^= 0xff // the secret was copied: the caller's slice is theirs
	if got := key.LogValue().String(); got != underA {
		t.Errorf("changing the caller's slice changed the digest from %q to %q", underA, got)
	}
	secretA[0] ^= 0xff

	if err := idem.SetKeyDigestSecret(secretB); err != nil {
		t.Fatal(err)
	}
	underB := key.LogValue().String()
	if underB == underA || underB == byDefault || underA == byDefault {
		t.Errorf("digests under the default, A and B: %q, %q, %q; want three different", byDefault, underA, underB)
	}
	// Another replica given secret A logs the key as the first did.
	if err := idem.SetKeyDigestSecret([]byte("replica-secret-number-one")); err != nil {
		t.Fatal(err)
	}
	if got := key.LogValue().String(); got != underA {
		t.Errorf("secret A again gives %q, want %q", got, underA)
	}

	// Setting a secret while other goroutines log is safe (go test -race).
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			log := slog.New(slog.NewJSONHandler(io.Discard, nil))
			for range 200 {
				log.Info("claim", "key", key, "digest", idem.KeyDigest("t", key))
			}
		})
		wg.Go(func() {
			secret := fmt.Appendf(nil, "concurrent-secret-%02d", i)
			for range 50 {
				if err := idem.SetKeyDigestSecret(secret); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

// TestKeyDigestScopes: one key in two scopes names two records and has two
// digests, and the scope and key cannot be shifted into one another.
func TestKeyDigestScopes(t *testing.T) {
	t.Parallel()
	const key idem.Key = "pay-0001"
	a, b := idem.KeyDigest("tenant-a", key), idem.KeyDigest("tenant-b", key)
	for _, d := range []string{a, b} {
		if !digestPattern.MatchString(d) {
			t.Errorf("digest %q is not hmac: and 16 hex characters", d)
		}
	}
	if a == b {
		t.Errorf("one key in two scopes has one digest %q", a)
	}
	if again := idem.KeyDigest("tenant-a", key); again != a {
		t.Errorf("KeyDigest gave %q, then %q", a, again)
	}
	if x, y := idem.KeyDigest("a", "bc"), idem.KeyDigest("ab", "c"); x == y {
		t.Errorf(`("a", "bc") and ("ab", "c") have one digest %q`, x)
	}
	if d, lv := idem.KeyDigest("", key), key.LogValue().String(); d == lv {
		t.Errorf("KeyDigest in the empty scope equals the digest of the key alone %q", d)
	}
}
