package idem

import (
	"errors"
	"strings"
	"testing"
)

// Seeds run as ordinary tests with `go test`; more live in
// testdata/fuzz/FuzzParseKey.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324",
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		` "a\"b\\c" `,
		`"a\nb"`,
		`"abc`,
		`"abc"x`,
		`a"b`,
		"\t\"\"\t",
		"caf\u00e9",
		"a b",
		strings.Repeat("k", MaxKeyLen),
		`"` + strings.Repeat("k", MaxKeyLen) + `"`,
		strings.Repeat("k", MaxKeyLen+1),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		k, err := ParseKey(header)
		if err != nil {
			if k != "" {
				t.Errorf("ParseKey(%q) returned key %q with error %v", header, k, err)
			}
			var ke *KeyError
			if !errors.Is(err, ErrInvalidKey) || !errors.As(err, &ke) || ke.Reason == "" {
				t.Errorf("ParseKey(%q): error %v is not a *KeyError with a reason", header, err)
			}
			return
		}
		if n := len(k); n < 1 || n > MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q, %d characters long", header, k, n)
		}
		for i := 0; i < len(k); i++ {
			if c := k[i]; c < 0x21 || c > 0x7e {
				t.Fatalf("ParseKey(%q) = %q, with byte %#x at %d", header, k, c, i)
			}
		}
		trimmed := strings.Trim(header, " \t")
		if !strings.HasPrefix(trimmed, `"`) && string(k) != trimmed {
			t.Errorf("bare ParseKey(%q) = %q, want it unchanged", header, k)
		}
		// Every accepted key, quoted as an RFC 9651 sf-string, names the
		// same key, so clients may send either form.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(string(k)) + `"`
		if k2, err := ParseKey(" " + quoted + "\t"); err != nil || k2 != k {
			t.Errorf("key %q from %q re-quoted as %s parses to %q, %v", k, header, quoted, k2, err)
		}
		if !strings.HasPrefix(string(k), `"`) {
			if k2, err := ParseKey(string(k)); err != nil || k2 != k {
				t.Errorf("key %q from %q as a bare token parses to %q, %v", k, header, k2, err)
			}
		}
	})
}
