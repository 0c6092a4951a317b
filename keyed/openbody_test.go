package keyed_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem/keyed"
)

// A kept body that is sealed but cut short (a store that truncated it, a
// copy made by hand) does not open, with ErrBodyUnreadable, and the error
// says what is known: "truncated" where the bytes end before the key's ID
// or before the nonce and the tag every sealed body holds, and the key's
// ID once the whole ID is there and no configured key has it, so that an
// operator knows which retired key to put back, whatever follows the ID:
// an empty ID too, which no key has, with nothing after it or more.
func TestOpenBodyOfACutSealedBody(t *testing.T) {
	t.Parallel()
	const magic = "\x00idem-gcm1\x00" // sealedBodyMagic
	keys := []keyed.BodyKey{bodyKey1}
	sealed, err := keyed.ResealBody(keys, "t", "a", "a", []byte(`{"ok":true}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, body string
		says       []string
	}{
		{"magic alone", magic, []string{"truncated"}},
		{"cut in the ID", magic + "\x02k", []string{"truncated"}},
		{"cut after the ID of a key not configured", magic + "\x02k9", []string{`"k9"`, "not among BodyKeys"}},
		{"cut in the nonce of a key not configured", magic + "\x02k9\x01\x02", []string{`"k9"`, "not among BodyKeys"}},
		{"an empty ID and nothing after it", magic + "\x00", []string{`key ""`, "not among BodyKeys"}},
		{"an empty ID and a byte after it", magic + "\x00n", []string{`key ""`, "not among BodyKeys"}},
		{"cut after the ID of a configured key", magic + "\x02k1", []string{"truncated"}},
		{"cut in its nonce", magic + "\x02k1\x01\x02\x03", []string{"truncated"}},
		{"cut right after its nonce", magic + "\x02k1" + strings.Repeat("n", 12), []string{"truncated"}},
		{"cut before a whole tag", magic + "\x02k1" + strings.Repeat("n", 12+15), []string{"truncated"}},
		{"a whole tag, altered", magic + "\x02k1" + strings.Repeat("n", 12+16), []string{`"k1"`, "does not authenticate"}},
		{"cut in its tag", string(sealed[:len(sealed)-1]), []string{`"k1"`, "does not authenticate"}},
	} {
		_, err := keyed.OpenBody(keys, "t", "a", []byte(c.body))
		if !errors.Is(err, keyed.ErrBodyUnreadable) {
			t.Errorf("%s: %v; want ErrBodyUnreadable", c.name, err)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q; want it to say %s", c.name, err, s)
			}
		}
	}
}

// The sealed form is magic | len(id) | id | nonce | ciphertext and tag,
// AES-256-GCM with the record's scope (its length a uvarint first) and key
// as additional data: a body sealed so by another program opens, the
// empty body too, whose sealed form is a nonce and a tag and nothing more.
func TestOpenBodyOfTheDocumentedForm(t *testing.T) {
	t.Parallel()
	const magic = "\x00idem-gcm1\x00" // sealedBodyMagic
	block, err := aes.NewCipher(bodyKey1.Key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	const scope, key = "tenant-a", "pay-1"
	ad := append(binary.AppendUvarint(nil, uint64(len(scope))), scope+key...)
	nonce := bytes.Repeat([]byte{9}, aead.NonceSize())
	for _, plain := range []string{"", `{"ok":true}`} {
		body := append([]byte(magic+"\x02"+bodyKey1.ID), nonce...)
		body = aead.Seal(body, nonce, []byte(plain), ad)
		got, err := keyed.OpenBody([]keyed.BodyKey{bodyKey1}, scope, key, body)
		if err != nil || string(got) != plain {
			t.Errorf("OpenBody of %q sealed by hand: %q, %v; want it back", plain, got, err)
		}
	}
}
