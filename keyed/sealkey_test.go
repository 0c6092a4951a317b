package keyed_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// SealKey's form, which stores keep and `idem keys show` recomputes from a
// key a person types: SealedKeyPrefix, then the unpadded base64url of the
// HMAC-SHA-256, keyed with the secret, of the scope's length (a uvarint),
// the scope and the key. It holds for any lengths: a scope far longer than
// its key, an empty scope, an empty key. The scope's length keeps a pair
// from digesting like another whose boundary falls elsewhere.
func TestSealKeyDigestsTheScopesLengthTheScopeAndTheKey(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	want := func(scope, key string) idem.Key {
		mac := hmac.New(sha256.New, secret)
		mac.Write(binary.AppendUvarint(nil, uint64(len(scope))))
		mac.Write([]byte(scope))
		mac.Write([]byte(key))
		return idem.Key(keyed.SealedKeyPrefix + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)))
	}
	for _, c := range []struct{ scope, key string }{
		{"tenant-a", "0f8fad5b-d9cb-469f-a165-70867728950e"},
		{"tenant-a", "k"},
		{strings.Repeat("tenant-with-a-long-name/", 8), "k"},
		{strings.Repeat("s", 300), "k"}, // a length of two uvarint bytes
		{"", "k"},
		{"tenant-a", ""},
	} {
		got := keyed.SealKey(secret, idem.Scope(c.scope), idem.Key(c.key))
		if w := want(c.scope, c.key); got != w {
			t.Errorf("SealKey(scope of %d bytes, key %q) = %q, want %q", len(c.scope), c.key, got, w)
		}
		if len(got) != 47 || !keyed.IsSealedKey(got) {
			t.Errorf("SealKey(scope of %d bytes, key %q) = %q: not a sealed key of 47 characters", len(c.scope), c.key, got)
		}
	}
	if a, b := keyed.SealKey(secret, "ab", "c"), keyed.SealKey(secret, "a", "bc"); a == b {
		t.Errorf("scope ab, key c and scope a, key bc seal alike: %q", a)
	}
}
