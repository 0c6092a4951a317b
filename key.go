package idem

import (
	"fmt"
	"log/slog"
	"strings"
)

// MaxKeyLen is the longest idempotency key accepted, in characters.
const MaxKeyLen = 255

// Key is a validated idempotency key: 1 to MaxKeyLen visible ASCII
// characters. Its LogValue redacts it, so logging a Key never leaks it.
type Key string

// LogValue implements slog.LogValuer: a keyed digest of the key alone,
// "hmac:" and 16 hex characters, that correlates log lines about one key
// without revealing it. The digest's secret is random per process unless
// set with SetKeyDigestSecret, so a short key cannot be recovered from the
// logs by hashing guesses. Where the scope is known, log KeyDigest instead.
func (k Key) LogValue() slog.Value { return slog.StringValue(keyedDigest('K', string(k))) }

// Scope says who owns a key: a tenant, an API key, an account. The same key
// in two scopes names two unrelated records; keys never cross scopes. The
// empty Scope is a valid, single global scope.
type Scope string

// LogValue implements slog.LogValuer. Scopes are tenant names, not secrets,
// so they are logged as they are.
func (s Scope) LogValue() slog.Value { return slog.StringValue(string(s)) }

// ParseKey parses the value of an Idempotency-Key header. It accepts both
// forms seen in the field:
//
//   - an RFC 9651 structured-field string, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
//     the form of the IETF draft (draft-ietf-httpapi-idempotency-key-header);
//     the escapes \" and \\ are honoured;
//   - a bare token, `8e03978e-40d5-43e8-bc93-6894a57f9324`, the form Stripe
//     and most clients send.
//
// Both give the same Key. Optional white space around the value is ignored.
// The key itself must be 1 to 255 visible ASCII characters (0x21 to 0x7E).
// Any other input returns a *KeyError naming what is wrong.
func ParseKey(header string) (Key, error) {
	v := strings.Trim(header, " \t")
	if v == "" {
		return "", &KeyError{Reason: "empty"}
	}
	if v[0] == '"' {
		s, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		v = s
	}
	if err := checkKey(v); err != nil {
		return "", err
	}
	return Key(v), nil
}

// parseSFString parses an RFC 9651 sf-string that must make up the whole
// input (section 4.2.5).
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) {
				return "", &KeyError{Reason: "quoted string ends in a lone backslash"}
			}
			if v[i] != '"' && v[i] != '\\' {
				return "", &KeyError{Reason: fmt.Sprintf("quoted string has an invalid escape \\%s", printable(v[i]))}
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", &KeyError{Reason: "unexpected characters after the closing quote (parameters are not supported)"}
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", &KeyError{Reason: fmt.Sprintf("character %s at position %d of the quoted string is not visible ASCII (0x21-0x7E)", printable(c), i)}
		default:
			b.WriteByte(c)
		}
	}
	return "", &KeyError{Reason: "quoted string has no closing quote"}
}

func checkKey(v string) error {
	if v == "" {
		return &KeyError{Reason: "empty"}
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return &KeyError{Reason: fmt.Sprintf("character %s at position %d is not visible ASCII (0x21-0x7E)", printable(c), i+1)}
		}
	}
	if len(v) > MaxKeyLen {
		return &KeyError{Reason: fmt.Sprintf("%d characters long; at most %d are allowed", len(v), MaxKeyLen)}
	}
	return nil
}

func printable(c byte) string {
	if c >= 0x21 && c <= 0x7e {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("0x%02X", c)
}
