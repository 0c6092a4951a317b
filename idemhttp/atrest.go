package idemhttp

import (
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Keys and answers at rest are sealed by the engine (package keyed), the
// same on every face: these names are kept for idemhttp's users.

// SealedKeyPrefix starts every key sealed with Config.KeySecret (see
// keyed.SealedKeyPrefix).
const SealedKeyPrefix = keyed.SealedKeyPrefix

// MinKeySecretLen is the shortest Config.KeySecret New accepts.
const MinKeySecretLen = keyed.MinKeySecretLen

// SealKey is the form in which a store keeps key when it is sealed with
// secret (see keyed.SealKey).
func SealKey(secret []byte, scope idem.Scope, key idem.Key) idem.Key {
	return keyed.SealKey(secret, scope, key)
}

// IsSealedKey reports whether key has the form SealKey gives (see
// keyed.IsSealedKey).
func IsSealedKey(key idem.Key) bool { return keyed.IsSealedKey(key) }

// BodyKey is one AES-256 key for the response bodies kept for replay
// (Config.BodyKeys).
type BodyKey = keyed.BodyKey

// ErrBodyUnreadable reports a kept response body that none of the
// configured BodyKeys opens: the duplicate gets 500 and nothing runs again.
var ErrBodyUnreadable = keyed.ErrBodyUnreadable

// OpenPoint returns a kept recovery point's data as the application saved
// it (see keyed.OpenPoint).
func OpenPoint(keys []BodyKey, scope idem.Scope, key idem.Key, name string, data []byte) ([]byte, error) {
	return keyed.OpenPoint(keys, scope, key, name, data)
}

// OpenBody returns a kept response body as the handler wrote it (see
// keyed.OpenBody).
func OpenBody(keys []BodyKey, scope idem.Scope, key idem.Key, body []byte) ([]byte, error) {
	return keyed.OpenBody(keys, scope, key, body)
}
