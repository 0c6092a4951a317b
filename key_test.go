package idem_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	uuid := "8e03978e-40d5-43e8-bc93-6894a57f9324"
	long := strings.Repeat("k", idem.MaxKeyLen)
	tests := []struct {
		name, header string
		want         idem.Key
		// reason, when set, is a fragment the error message must contain.
		reason string
	}{
		{name: "bare token", header: uuid, want: idem.Key(uuid)},
		{name: "sf-string", header: `"` + uuid + `"`, want: idem.Key(uuid)},
		{name: "single character", header: "x", want: "x"},
		{name: "all visible ASCII", header: "!#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~", want: "!#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~"},
		{name: "all visible ASCII quoted", header: "\"!#$%&'()*+,-./09:;<=>?@AZ[\\\\]^_`az{|}~\"", want: "!#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~"},
		{name: "bare token with quote inside", header: `a"b`, want: `a"b`},
		{name: "sf-string escaped quote", header: `"a\"b"`, want: `a"b`},
		{name: "sf-string escaped backslash", header: `"a\\b"`, want: `a\b`},
		{name: "sf-string only escapes", header: `"\\\""`, want: `\"`},
		{name: "OWS trimmed around token", header: " \t" + uuid + "\t ", want: idem.Key(uuid)},
		{name: "OWS trimmed around sf-string", header: `  "abc"` + "\t", want: "abc"},
		{name: "255 characters", header: long, want: idem.Key(long)},
		{name: "255 characters quoted", header: `"` + long + `"`, want: idem.Key(long)},

		{name: "empty", header: "", reason: "empty"},
		{name: "only white space", header: " \t ", reason: "empty"},
		{name: "empty sf-string", header: `""`, reason: "empty"},
		{name: "256 characters", header: long + "k", reason: "256 characters long; at most 255"},
		{name: "256 characters quoted", header: `"` + long + `k"`, reason: "256 characters long; at most 255"},
		{name: "invalid escape", header: `"a\nb"`, reason: `invalid escape \'n'`},
		{name: "invalid escape of the lowest visible character", header: `"a\!b"`, reason: `invalid escape \'!'`},
		{name: "invalid escape of the highest visible character", header: `"a\~b"`, reason: `invalid escape \'~'`},
		{name: "escaped control character", header: "\"a\\\x01\"", reason: `invalid escape \0x01`},
		{name: "lone backslash at end", header: `"abc\`, reason: "lone backslash"},
		{name: "unterminated", header: `"abc`, reason: "no closing quote"},
		{name: "unterminated after escaped quote", header: `"abc\"`, reason: "no closing quote"},
		{name: "only an opening quote", header: `"`, reason: "no closing quote"},
		{name: "characters after closing quote", header: `"abc"def`, reason: "after the closing quote"},
		{name: "parameters after closing quote", header: `"abc";p=1`, reason: "parameters are not supported"},
		{name: "two sf-strings", header: `"a", "b"`, reason: "after the closing quote"},
		{name: "inner space", header: "ab cd", reason: "character 0x20 at position 3 is not visible ASCII"},
		{name: "inner tab", header: "ab\tcd", reason: "character 0x09 at position 3"},
		{name: "space inside sf-string", header: `"ab cd"`, reason: "0x20 at position 3"},
		{name: "space at start of sf-string", header: `" abc"`, reason: "0x20 at position 1"},
		{name: "control character", header: "ab\x00", reason: "character 0x00 at position 3"},
		{name: "DEL", header: "ab\x7f", reason: "character 0x7F"},
		{name: "DEL in sf-string", header: "\"ab\x7f\"", reason: "character 0x7F at position 3 of the quoted string"},
		{name: "non-ASCII", header: "caf\u00e9", reason: "character 0xC3 at position 4"},
		{name: "non-ASCII in sf-string", header: "\"caf\u00e9\"", reason: "0xC3 at position 4 of the quoted string is not visible ASCII"},
		{name: "newline", header: "abc\r\n", reason: "0x0D at position 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idem.ParseKey(tt.header)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("ParseKey(%q): %v", tt.header, err)
				}
				if got != tt.want {
					t.Errorf("ParseKey(%q) = %q, want %q", tt.header, got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseKey(%q) = %q, want an error saying %q", tt.header, got, tt.reason)
			}
			if got != "" {
				t.Errorf("ParseKey(%q) returned key %q with its error", tt.header, got)
			}
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Errorf("error %v does not match ErrInvalidKey", err)
			}
			var ke *idem.KeyError
			if !errors.As(err, &ke) {
				t.Errorf("error %v is a %T, not a *KeyError", err, err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not say %q", err, tt.reason)
			}
		})
	}
}

func TestKeyLogValueRedacts(t *testing.T) {
	t.Parallel()
	const secret = "pay-2f1c0e-secret-key"
	k, err := idem.ParseKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	v := k.LogValue()
	if strings.Contains(v.String(), secret) {
		t.Errorf("LogValue %q contains the key", v)
	}
	if v.String() == "" {
		t.Error("LogValue is empty: log lines about a key could not be correlated")
	}
	if other := idem.Key(secret + "x").LogValue(); other.String() == v.String() {
		t.Errorf("two keys log as the same value %q", v)
	}
	if again := idem.Key(secret).LogValue(); again.String() != v.String() {
		t.Errorf("one key logs as %q and %q", v, again)
	}

	// Through a real handler, as a field and nested in a group.
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("claim", "key", k, slog.Group("req", "key", k), "scope", idem.Scope("tenant-7"))
	if strings.Contains(buf.String(), secret) {
		t.Errorf("log line contains the key: %s", buf.String())
	}
	if !strings.Contains(buf.String(), v.String()) || !strings.Contains(buf.String(), "tenant-7") {
		t.Errorf("log line lacks the redacted key or the scope: %s", buf.String())
	}
}

// TestKeyLogValueIsKeyed: a logged key is a keyed digest, never the
// unsalted SHA-256 prefix that anyone could compute from a guessed key.
func TestKeyLogValueIsKeyed(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"1", "42", "pay-0001", "8e03978e-40d5-43e8-bc93-6894a57f9324"} {
		got := idem.Key(key).LogValue().String()
		if !digestPattern.MatchString(got) {
			t.Errorf("Key(%q).LogValue() = %q, want hmac: and 16 hex characters", key, got)
		}
		for _, p := range unkeyedPrefixes(key) {
			if strings.Contains(got, p) {
				t.Errorf("Key(%q).LogValue() = %q holds the unkeyed SHA-256 prefix %s", key, got, p)
			}
		}
	}
}
