package idemredis

import (
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// clusterHashTag returns what Redis Cluster hashes for key: the text
// between the first '{' and the first '}' after it when that is not empty,
// otherwise the whole key (the rule of the Redis Cluster specification).
func clusterHashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster takes modulo 16384.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

func keySlot(key string) int {
	return int(crc16(clusterHashTag(key)) % 16384)
}

func TestKeySlot(t *testing.T) {
	t.Parallel()
	// The check value of CRC-16/XMODEM, and slots Redis itself reports
	// (CLUSTER KEYSLOT), so the helper the layout tests rely on is right.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]int{"foo": 12182, "{user1000}.following": keySlot("user1000"), "a{}b": keySlot("a{}b")} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if clusterHashTag("a{}b") != "a{}b" {
		t.Error("an empty hash tag must not count")
	}
}

func TestKeyLayout(t *testing.T) {
	t.Parallel()
	cases := []struct {
		scope      idem.Scope
		key        idem.Key
		wantRecord string
		wantTag    string
	}{
		{"tenant-a", "order-1", "idem:{tenant-a}:order-1", "tenant-a"},
		{"", "order-1", "idem:{%}:order-1", "%"},
		{"a}b", "k", "idem:{a%7Db}:k", "a%7Db"},
		{"a{b", "k", "idem:{a%7Bb}:k", "a%7Bb"},
		{"}", "k", "idem:{%7D}:k", "%7D"},
		{"%", "k", "idem:{%25}:k", "%25"},
		{"{}", "k", "idem:{%7B%7D}:k", "%7B%7D"},
		// Braces in the key come after the tag and change nothing.
		{"s", "x}{y", "idem:{s}:x}{y", "s"},
	}
	for _, tc := range cases {
		rk := recordKey("idem", tc.scope, tc.key)
		if rk != tc.wantRecord {
			t.Errorf("scope %q, key %q: key %q, want %q", tc.scope, tc.key, rk, tc.wantRecord)
		}
		if got := clusterHashTag(rk); got != tc.wantTag {
			t.Errorf("scope %q: the cluster hashes %q of the record key, want the tag %q", tc.scope, got, tc.wantTag)
		}
	}
}

func TestHashTagsAreDistinct(t *testing.T) {
	t.Parallel()
	// Every scope gets its own tag: the escaping is injective, the empty
	// scope included.
	scopes := []idem.Scope{"", "%", "%25", "%7D", "}", "{", "{}", "a", "a}", "a%7D", "%%", "% "}
	seen := make(map[string]idem.Scope)
	for _, s := range scopes {
		tag := hashTag(s)
		if tag == "" || strings.Contains(tag, "}") {
			t.Errorf("hashTag(%q) = %q: empty or holding '}'", s, tag)
		}
		if prev, ok := seen[tag]; ok {
			t.Errorf("scopes %q and %q share the tag %q", prev, s, tag)
		}
		seen[tag] = s
	}
}

func TestRecordPattern(t *testing.T) {
	t.Parallel()
	for prefix, want := range map[string]string{
		"idem":       "idem:{*}:*",
		"app*[1]?\\": `app\*\[1\]\?\\:{*}:*`,
	} {
		if got := recordPattern(prefix); got != want {
			t.Errorf("recordPattern(%q) = %q, want %q", prefix, got, want)
		}
	}
}
