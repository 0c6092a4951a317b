package idem

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
)

// minKeyDigestSecretLen is the shortest secret SetKeyDigestSecret accepts:
// 128 bits, beyond the reach of a brute-force search.
const minKeyDigestSecretLen = 16

// keyDigestSecret is the secret set with SetKeyDigestSecret, nil until
// then. An atomic pointer because a secret may be set while other
// goroutines log.
var keyDigestSecret atomic.Pointer[[]byte]

// processKeyDigestSecret is the secret used until one is set: random, drawn
// once per process on first use, so that digests correlate lines of one
// process and nothing else.
var processKeyDigestSecret = sync.OnceValue(func() []byte {
	s := make([]byte, 32)
	rand.Read(s) // never fails: it crashes the program rather than return predictable bytes
	return s
})

// SetKeyDigestSecret sets the secret of the keyed digests under which keys
// are logged (Key.LogValue, KeyDigest). Until it is called, each process
// draws a random secret of its own, so the same key logs differently in
// every process and across restarts. Set the same secret on every replica
// to correlate their logs; keep it as secret as the keys themselves, since
// whoever holds it can test guessed keys against the logs.
//
// The secret must be at least 16 bytes long; a shorter one returns an
// *ArgumentError and changes nothing. The secret is copied. It is safe to
// call while other goroutines log.
func SetKeyDigestSecret(secret []byte) error {
	if len(secret) < minKeyDigestSecretLen {
		return &ArgumentError{Field: "key digest secret",
			Reason: fmt.Sprintf("%d bytes long; at least %d are needed", len(secret), minKeyDigestSecretLen)}
	}
	s := append([]byte(nil), secret...)
	keyDigestSecret.Store(&s)
	return nil
}

// KeyDigest returns a digest of key in scope for logs: "hmac:" and 16 hex
// characters (64 bits) of an HMAC-SHA-256 under the secret of
// SetKeyDigestSecret. It correlates the log lines about one key without
// revealing it; the same key in two scopes has two digests, as it names
// two records. Use it wherever the scope is known; Key.LogValue digests
// the key alone.
func KeyDigest(scope Scope, key Key) string {
	return keyedDigest('S', string(scope), string(key))
}

// keyedDigest is the HMAC of tag and fields, each field preceded by its
// length so that no two lists of fields are written alike (("a", "bc") and
// ("ab", "c") differ). The tag keeps digests of different kinds apart.
func keyedDigest(tag byte, fields ...string) string {
	secret := keyDigestSecret.Load()
	var key []byte
	if secret != nil {
		key = *secret
	} else {
		key = processKeyDigestSecret()
	}
	mac := hmac.New(sha256.New, key)
	var head [9]byte
	head[0] = tag
	mac.Write(head[:1])
	for _, f := range fields {
		binary.BigEndian.PutUint64(head[1:], uint64(len(f)))
		mac.Write(head[1:])
		mac.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	var out [len("hmac:") + 16]byte
	copy(out[:], "hmac:")
	hex.Encode(out[len("hmac:"):], mac.Sum(sum[:0])[:8])
	return string(out[:])
}
