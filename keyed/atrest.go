package keyed

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"

	"github.com/idem-go/idem"
)

// What a store keeps can be read by anyone who reads the store: a database
// dump, a backup, a Redis replica. Two settings keep the keys and the
// answers out of it (Config.KeySecret, Config.BodyKeys); both work the same
// on every store, because the engine applies them before the store
// sees anything.

// SealedKeyPrefix starts every key sealed with Config.KeySecret. What
// follows it is 43 characters of unpadded base64url: the HMAC-SHA-256, keyed
// with the secret, of the scope and the key. A sealed key is itself a valid
// Idempotency-Key (visible ASCII, 47 characters), so a handler can pass it
// downstream as the key of its next call.
const SealedKeyPrefix = "hk1_"

// MinKeySecretLen is the shortest Config.KeySecret New accepts.
const MinKeySecretLen = 16

// SealKey is the form in which a store keeps key when it is sealed with
// secret: SealedKeyPrefix and the HMAC-SHA-256 of the scope and the key.
// The scope is part of what is digested, so one key sent by two tenants
// has two unrelated sealed forms; the scope itself is kept as it is, since
// stores group and shard by it. `idem keys show` uses SealKey to find a
// record from the key a person types.
func SealKey(secret []byte, scope idem.Scope, key idem.Key) idem.Key {
	return sealKeyWith(hmac.New(sha256.New, secret), scope, key)
}

// sealKeyWith is SealKey with mac, a fresh or reset HMAC-SHA-256 keyed with
// the secret.
func sealKeyWith(mac hash.Hash, scope idem.Scope, key idem.Key) idem.Key {
	// The scope's length first, so that no (scope, key) pair digests like
	// another whose boundary falls elsewhere.
	in := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(scope)+len(key)), uint64(len(scope)))
	in = append(in, scope...)
	in = append(in, key...)
	mac.Write(in)
	var sum [sha256.Size]byte
	out := make([]byte, len(SealedKeyPrefix)+base64.RawURLEncoding.EncodedLen(sha256.Size))
	copy(out, SealedKeyPrefix)
	base64.RawURLEncoding.Encode(out[len(SealedKeyPrefix):], mac.Sum(sum[:0]))
	return idem.Key(out)
}

// keySealer seals keys with one secret, reusing its HMACs: keying one
// costs two SHA-256 blocks and most of SealKey's allocations.
type keySealer struct{ macs sync.Pool }

func newKeySealer(secret []byte) *keySealer {
	if secret == nil {
		return nil
	}
	secret = bytes.Clone(secret)
	return &keySealer{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

func (k *keySealer) seal(scope idem.Scope, key idem.Key) idem.Key {
	mac := k.macs.Get().(hash.Hash)
	mac.Reset()
	sealed := sealKeyWith(mac, scope, key)
	k.macs.Put(mac)
	return sealed
}

// IsSealedKey reports whether key has the form SealKey gives. A client may
// send a key of that form itself; it is then sealed again like any other,
// so the form alone never lets a client address another's record.
func IsSealedKey(key idem.Key) bool {
	s := string(key)
	if len(s) != len(SealedKeyPrefix)+43 || !strings.HasPrefix(s, SealedKeyPrefix) {
		return false
	}
	_, err := base64.RawURLEncoding.Strict().DecodeString(s[len(SealedKeyPrefix):])
	return err == nil
}

// BodyKey is one AES-256 key for the response bodies the engine keeps
// for replay (Config.BodyKeys).
type BodyKey struct {
	// ID names the key in every body sealed with it, so that a body can be
	// opened after newer keys were added: 1 to 32 visible ASCII characters.
	ID string
	// Key is the AES-256 key: 32 bytes, random.
	Key []byte
}

// sealedBodyMagic starts every sealed body. It begins with a NUL byte,
// which no JSON or text body does, so a body kept before encryption was
// turned on is told apart and replayed as it is.
const sealedBodyMagic = "\x00idem-gcm1\x00"

// ErrBodyUnreadable reports a kept response body that none of the
// configured BodyKeys opens: sealed with a key since removed, or altered in
// the store. The duplicate gets 500 and nothing runs again.
var ErrBodyUnreadable = errors.New("keyed: kept response body cannot be opened")

// bodySealer seals and opens kept bodies with AES-256-GCM. Each body has a
// fresh random nonce; the scope and the (stored) key are authenticated
// with it, so a body moved to another record does not open there.
type bodySealer struct {
	current *sealKey
	byID    map[string]*sealKey
}

type sealKey struct {
	id   string
	aead cipher.AEAD
}

func newBodySealer(keys []BodyKey) (*bodySealer, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	s := &bodySealer{byID: make(map[string]*sealKey, len(keys))}
	for i, k := range keys {
		if len(k.ID) == 0 || len(k.ID) > 32 || strings.IndexFunc(k.ID, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			return nil, fmt.Errorf("BodyKeys[%d]: ID %q must be 1 to 32 visible ASCII characters", i, k.ID)
		}
		if len(k.Key) != 32 {
			return nil, fmt.Errorf("BodyKeys[%d] (%s): key is %d bytes; AES-256 needs 32", i, k.ID, len(k.Key))
		}
		if _, dup := s.byID[k.ID]; dup {
			return nil, fmt.Errorf("BodyKeys[%d]: ID %q given twice", i, k.ID)
		}
		block, err := aes.NewCipher(k.Key)
		if err != nil {
			return nil, fmt.Errorf("BodyKeys[%d] (%s): %w", i, k.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("BodyKeys[%d] (%s): %w", i, k.ID, err)
		}
		sk := &sealKey{id: k.ID, aead: aead}
		s.byID[k.ID] = sk
		if i == 0 {
			s.current = sk
		}
	}
	return s, nil
}

// bodyAD is what a sealed body is bound to: its record's scope and key.
func bodyAD(scope idem.Scope, key idem.Key) []byte {
	var n [binary.MaxVarintLen64]byte
	ad := append([]byte(nil), n[:binary.PutUvarint(n[:], uint64(len(scope)))]...)
	ad = append(ad, scope...)
	return append(ad, key...)
}

// seal returns body encrypted with the current key, in the form
// magic | len(id) | id | nonce | ciphertext and tag.
func (s *bodySealer) seal(scope idem.Scope, key idem.Key, body []byte) ([]byte, error) {
	return s.sealAD(bodyAD(scope, key), body)
}

// sealAD is seal with ad, what the sealed bytes are bound to.
func (s *bodySealer) sealAD(ad, body []byte) ([]byte, error) {
	k := s.current
	ns := k.aead.NonceSize()
	out := make([]byte, 0, len(sealedBodyMagic)+1+len(k.id)+ns+len(body)+k.aead.Overhead())
	out = append(out, sealedBodyMagic...)
	out = append(out, byte(len(k.id)))
	out = append(out, k.id...)
	nonce := out[len(out) : len(out)+ns]
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out = out[:len(out)+ns]
	return k.aead.Seal(out, nonce, body, ad), nil
}

// open returns the plain body of a kept one, and whether it was sealed: a
// sealed body decrypted, any other as it is (kept before BodyKeys was set).
func (s *bodySealer) open(scope idem.Scope, key idem.Key, body []byte) ([]byte, bool, error) {
	return s.openAD(bodyAD(scope, key), body)
}

// openAD is open with ad, what the sealed bytes are bound to. s may be
// nil: then only bytes that were never sealed open.
func (s *bodySealer) openAD(ad, body []byte) ([]byte, bool, error) {
	if !bytes.HasPrefix(body, []byte(sealedBodyMagic)) {
		return body, false, nil
	}
	rest := body[len(sealedBodyMagic):]
	if s == nil {
		return nil, true, fmt.Errorf("%w: it is sealed, and no BodyKeys are configured", ErrBodyUnreadable)
	}
	if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
		return nil, true, fmt.Errorf("%w: truncated", ErrBodyUnreadable)
	}
	id := string(rest[1 : 1+int(rest[0])])
	rest = rest[1+int(rest[0]):]
	k, ok := s.byID[id]
	if !ok {
		return nil, true, fmt.Errorf("%w: sealed with key %q, which is not among BodyKeys", ErrBodyUnreadable, id)
	}
	// Every sealed body holds at least a nonce and a tag: one shorter was
	// cut, not altered.
	ns := k.aead.NonceSize()
	if len(rest) < ns+k.aead.Overhead() {
		return nil, true, fmt.Errorf("%w: truncated", ErrBodyUnreadable)
	}
	plain, err := k.aead.Open(nil, rest[:ns], rest[ns:], ad)
	if err != nil {
		return nil, true, fmt.Errorf("%w: key %q does not authenticate it (altered, or moved from another record)", ErrBodyUnreadable, id)
	}
	return plain, true, nil
}

// OpenBody returns a kept response body as the handler wrote it: opened
// with keys when it was sealed with one of them (Config.BodyKeys), as it is
// otherwise. scope and key are the record's, as the store keeps them
// (sealed, with Config.KeySecret). Tools that show kept answers, such as
// `idem keys show`, use it; an error wraps ErrBodyUnreadable, or says what
// is wrong with keys.
func OpenBody(keys []BodyKey, scope idem.Scope, key idem.Key, body []byte) ([]byte, error) {
	s, err := newBodySealer(keys)
	if err != nil {
		return nil, err
	}
	plain, _, err := s.open(scope, key, body)
	return plain, err
}
