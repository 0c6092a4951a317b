package keyed_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem/keyed"
)

// A kept body that is sealed but cut short (a store that truncated it, a
// copy made by hand) does not open, with ErrBodyUnreadable, and the error
// says what is known: "truncated" where the bytes end before the key's ID
// or before what that key needs, and the key's ID once the whole ID is
// there and no configured key has it, so that an operator knows which
// retired key to put back, whatever follows the ID.
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
		{"cut after the ID of a configured key", magic + "\x02k1", []string{"truncated"}},
		{"cut in its nonce", magic + "\x02k1\x01\x02\x03", []string{"truncated"}},
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
