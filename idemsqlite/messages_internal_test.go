package idemsqlite

import (
	"database/sql"
	"maps"
	"testing"
)

func TestHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    map[string]string
		// encoded says whether the base64 form is expected.
		encoded bool
	}{
		{"none", nil, false},
		{"text", map[string]string{"Content-Type": "application/json", "X-Empty": "", "X-Unicode": "ünïcødé ✓"}, false},
		{"bytes in a value", map[string]string{"A": "ok", "X-Raw": "\xff\xfe\x00"}, true},
		{"bytes in a key", map[string]string{"\xc3": "v"}, true},
		{"looks like the prefix", map[string]string{"base64:": "base64:{}"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, err := encodeHeaders(tc.h)
			if err != nil {
				t.Fatal(err)
			}
			var stored sql.NullString
			if v != nil {
				stored = sql.NullString{String: v.(string), Valid: true}
			}
			if got := len(stored.String) >= len(base64Headers) && stored.String[:len(base64Headers)] == base64Headers; got != tc.encoded {
				t.Errorf("stored %q: base64 form = %v, want %v", stored.String, got, tc.encoded)
			}
			got, err := decodeHeaders(stored)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.h) || !maps.Equal(got, tc.h) {
				t.Errorf("round trip = %q, want %q", got, tc.h)
			}
		})
	}
}
