package payments

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem/idemhttp"
)

// The service's own tables keep what a client wrote in free text (a
// payment's description, a refund's reason) sealed with the body keys
// (Config.BodyKeys) when they are set, as the kept answers are: AES-256-GCM
// with a fresh nonce, under a key derived from the body key for this use,
// bound to the column, the tenant and the row's ID, so that a text copied
// to another row, or another column, does not open there. Empty text is
// kept empty: it says nothing.
//
// A sealed text is sealedTextPrefix, the key's ID, a dot, and the
// base64url of the nonce and the ciphertext. The prefix begins with a
// control character, which no text the service accepts contains
// (validateDescription), so a text kept in clear is never taken for a
// sealed one.
const sealedTextPrefix = "\x01sf1:"

// errTextUnreadable: a sealed text that none of the body keys opens (its
// key was removed, or the row was altered).
var errTextUnreadable = errors.New("payments: a sealed text opens with none of the body keys (give the body keys it was sealed with)")

// textSealer seals and opens the free text of the service's rows. The zero
// value keeps text in clear and opens none. skip makes reads give sealed
// text as "" without opening it, for readers that need none of it
// (reconcile).
type textSealer struct {
	keys []idemhttp.BodyKey
	skip bool
}

// textColumn names a free-text column: its table and column.
type textColumn string

const (
	colDescription textColumn = "payments.description"
	colReason      textColumn = "refunds.reason"
)

// textAD is what a sealed text is bound to.
func textAD(col textColumn, tenant, id string) []byte {
	var b strings.Builder
	for _, part := range []string{"idem lab text v1", string(col), tenant, id} {
		fmt.Fprintf(&b, "%d:%s;", len(part), part)
	}
	return []byte(b.String())
}

// textAEAD is the cipher of one body key, for texts: its key derived from
// the body key, apart from the bodies'.
func textAEAD(k idemhttp.BodyKey) (cipher.AEAD, error) {
	mac := hmac.New(sha256.New, k.Key)
	mac.Write([]byte("idem lab text key v1"))
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// isSealedText reports whether v is a sealed text, and with which key's ID.
func isSealedText(v string) (keyID string, ok bool) {
	rest, ok := strings.CutPrefix(v, sealedTextPrefix)
	if !ok {
		return "", false
	}
	id, _, found := strings.Cut(rest, ".")
	return id, found
}

// seal returns what the row keeps of text: text sealed with the first body
// key, or text itself when there are none (or it is empty).
func (t textSealer) seal(col textColumn, tenant, id, text string) (string, error) {
	if len(t.keys) == 0 || text == "" {
		return text, nil
	}
	return sealTextWith(t.keys[0], col, tenant, id, text)
}

func sealTextWith(k idemhttp.BodyKey, col textColumn, tenant, id, text string) (string, error) {
	aead, err := textAEAD(k)
	if err != nil {
		return "", fmt.Errorf("sealing a text: %w", err)
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(text)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("sealing a text: %w", err)
	}
	out := aead.Seal(nonce, nonce, []byte(text), textAD(col, tenant, id))
	return sealedTextPrefix + k.ID + "." + base64.RawURLEncoding.EncodeToString(out), nil
}

// open returns the text a row keeps: opened when sealed.
func (t textSealer) open(col textColumn, tenant, id, kept string) (string, error) {
	if _, sealed := isSealedText(kept); !sealed {
		return kept, nil
	}
	if t.skip {
		return "", nil
	}
	return openText(t.keys, col, tenant, id, kept)
}

func openText(keys []idemhttp.BodyKey, col textColumn, tenant, id, kept string) (string, error) {
	keyID, _ := isSealedText(kept)
	b64 := strings.TrimPrefix(kept, sealedTextPrefix+keyID+".")
	raw, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil {
		return "", fmt.Errorf("%w: %s of %s is malformed", errTextUnreadable, col, id)
	}
	for _, k := range keys {
		if k.ID != keyID {
			continue
		}
		aead, err := textAEAD(k)
		if err != nil {
			return "", err
		}
		if len(raw) < aead.NonceSize() {
			break
		}
		text, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], textAD(col, tenant, id))
		if err != nil {
			break
		}
		return string(text), nil
	}
	return "", fmt.Errorf("%w: %s of %s, sealed with key %q", errTextUnreadable, col, id, keyID)
}

// resealText returns what a row should keep of kept once the body keys
// are keys: kept in clear sealed with the first key, kept sealed with
// another key opened and sealed again with the first (a rotation), and
// changed false when it is as it should be already. It never unseals:
// without keys, nothing changes.
func resealText(keys []idemhttp.BodyKey, col textColumn, tenant, id, kept string) (string, bool, error) {
	if len(keys) == 0 || kept == "" {
		return kept, false, nil
	}
	keyID, sealed := isSealedText(kept)
	if sealed && keyID == keys[0].ID {
		return kept, false, nil
	}
	text := kept
	if sealed {
		var err error
		if text, err = openText(keys, col, tenant, id, kept); err != nil {
			return "", false, err
		}
	}
	out, err := sealTextWith(keys[0], col, tenant, id, text)
	return out, err == nil, err
}

// OpenDescription returns the description a payments row keeps (kept,
// the description column of the row of payment id of tenant), opened
// with keys when the service sealed it: what a reader of the service's
// database outside it (the torture's check) reads descriptions through,
// so that it sees what the service sees. A sealed description without
// the key that sealed it is an error, never the sealed bytes.
func OpenDescription(keys []idemhttp.BodyKey, tenant, id, kept string) (string, error) {
	if _, sealed := isSealedText(kept); sealed && len(keys) == 0 {
		return "", fmt.Errorf("%w: the description of payment %s is sealed; give the service's body keys (IDEM_BODY_KEYS)", errTextUnreadable, id)
	}
	return textSealer{keys: keys}.open(colDescription, tenant, id, kept)
}
