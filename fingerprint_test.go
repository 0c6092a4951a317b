package idem_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

const jsonType = "application/json"

func TestFingerprintSameRequest(t *testing.T) {
	t.Parallel()
	body := `{"amount":1000,"currency":"eur","items":[{"sku":"a","qty":1}]}`
	base := idem.NewFingerprint("POST", "/v1/charges", "a=1&b=2", jsonType, []byte(body))
	tests := []struct {
		name                      string
		method, path, query, ctyp string
		body                      string
	}{
		{name: "identical", body: body},
		{name: "member order", body: `{"items":[{"qty":1,"sku":"a"}],"currency":"eur","amount":1000}`},
		{name: "white space", body: "{\n  \"amount\": 1000,\n  \"currency\": \"eur\",\n  \"items\": [ { \"sku\": \"a\", \"qty\": 1 } ]\n}\n"},
		{name: "number spelling", body: `{"amount":1E3,"currency":"eur","items":[{"sku":"a","qty":1.0}]}`},
		{name: "string escapes", body: `{"amount":1000,"currency":"\u0065ur","items":[{"sku":"a","qty":1}]}`},
		{name: "query parameter order", query: "b=2&a=1", body: body},
		{name: "query escaping", query: "a=%31&b=2", body: body},
		{name: "JSON with charset", ctyp: "application/json; charset=utf-8", body: body},
		{name: "media type case", ctyp: "Application/JSON", body: body},
		{name: "structured suffix", ctyp: "application/merge-patch+json", body: body},
		{name: "no content type", ctyp: " ", body: body},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			method, path, query, ctyp := orDefault(tt.method, "POST"), orDefault(tt.path, "/v1/charges"), orDefault(tt.query, "a=1&b=2"), orDefault(tt.ctyp, jsonType)
			if got := idem.NewFingerprint(method, path, query, ctyp, []byte(tt.body)); got != base {
				t.Errorf("fingerprint %s differs from %s", got, base)
			}
		})
	}
}

func TestFingerprintDifferentRequest(t *testing.T) {
	t.Parallel()
	body := `{"amount":1000,"currency":"eur"}`
	type req struct{ method, path, query, ctyp, body string }
	base := req{"POST", "/v1/charges", "a=1&b=2", jsonType, body}
	tests := []struct {
		name string
		r    req
	}{
		{"method", req{"PUT", base.path, base.query, base.ctyp, base.body}},
		{"method case (methods are case-sensitive)", req{"post", base.path, base.query, base.ctyp, base.body}},
		{"path", req{base.method, "/v1/refunds", base.query, base.ctyp, base.body}},
		{"path case", req{base.method, "/V1/charges", base.query, base.ctyp, base.body}},
		{"query value", req{base.method, base.path, "a=1&b=3", base.ctyp, base.body}},
		{"query parameter added", req{base.method, base.path, "a=1&b=2&c=", base.ctyp, base.body}},
		{"query removed", req{base.method, base.path, "", base.ctyp, base.body}},
		{"repeated values reordered", req{base.method, base.path, "a=1&a=2&b=2", base.ctyp, base.body}},
		{"body value", req{base.method, base.path, base.query, base.ctyp, `{"amount":1001,"currency":"eur"}`}},
		{"body number as string", req{base.method, base.path, base.query, base.ctyp, `{"amount":"1000","currency":"eur"}`}},
		{"body member added", req{base.method, base.path, base.query, base.ctyp, `{"amount":1000,"currency":"eur","x":null}`}},
		{"empty body", req{base.method, base.path, base.query, base.ctyp, ""}},
		{"same bytes not as JSON", req{base.method, base.path, base.query, "text/plain", base.body}},
		// Length prefixes keep field boundaries: moving bytes from one
		// field to the next changes the fingerprint.
		{"boundary path/query", req{base.method, "/v1/chargesa=1&b=2", "", base.ctyp, base.body}},
		{"boundary method/path", req{"POST/v1", "/charges", base.query, base.ctyp, base.body}},
	}
	fp := func(r req) idem.Fingerprint {
		return idem.NewFingerprint(r.method, r.path, r.query, r.ctyp, []byte(r.body))
	}
	want := fp(base)
	seen := map[idem.Fingerprint]string{want: "base"}
	for _, tt := range tests {
		got := fp(tt.r)
		if other, dup := seen[got]; dup {
			t.Errorf("%s: fingerprint %s is the same as for %s", tt.name, got, other)
		}
		seen[got] = tt.name
	}
	if a, b := fp(req{"POST", "/", "a=1&a=2", "", ""}), fp(req{"POST", "/", "a=2&a=1", "", ""}); a == b {
		t.Error("the order of a repeated query parameter's values does not count")
	}
}

func TestFingerprintBytesFallback(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		{"invalid JSON", `{"amount": 1000,`},
		{"duplicate member", `{"a":1,"a":2}`},
		{"number overflow", `{"a":1e400}`},
		{"lone surrogate", `{"a":"\ud800"}`},
		{"not JSON at all", "amount=1000&currency=eur"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Content-Type is not part of the fingerprint, so a JSON body that
			// cannot be canonicalised hashes exactly like the same bytes
			// sent as an opaque type.
			asJSON := idem.NewFingerprint("POST", "/p", "", jsonType, []byte(tt.body))
			asBytes := idem.NewFingerprint("POST", "/p", "", "application/octet-stream", []byte(tt.body))
			if asJSON != asBytes {
				t.Errorf("JSON-typed body that cannot be canonicalised: %s, as bytes: %s", asJSON, asBytes)
			}
			// Hashed as bytes, white space counts.
			spaced := idem.NewFingerprint("POST", "/p", "", jsonType, []byte(" "+tt.body))
			if spaced == asJSON {
				t.Error("a leading space did not change the fingerprint of a body hashed as bytes")
			}
		})
	}
}

func TestFingerprintNonJSONType(t *testing.T) {
	t.Parallel()
	for _, ctyp := range []string{"text/plain", "application/x-www-form-urlencoded", "application/jsonx", "application/json-seq", "multipart/form-data; boundary=x", "not a media type/"} {
		a := idem.NewFingerprint("POST", "/p", "", ctyp, []byte(`{"a":1,"b":2}`))
		b := idem.NewFingerprint("POST", "/p", "", ctyp, []byte(`{"b":2,"a":1}`))
		if a == b {
			t.Errorf("Content-Type %q: reordered body has the same fingerprint, want its bytes hashed", ctyp)
		}
	}
}

func TestFingerprintFormat(t *testing.T) {
	t.Parallel()
	fp := string(idem.NewFingerprint("GET", "/", "", "", nil))
	rest, ok := strings.CutPrefix(fp, idem.FingerprintVersion+":")
	if !ok || idem.FingerprintVersion != "v1" {
		t.Fatalf("fingerprint %q does not start with v1:", fp)
	}
	if b, err := hex.DecodeString(rest); err != nil || len(b) != sha256.Size || strings.ToLower(rest) != rest {
		t.Errorf("fingerprint %q is not v1: then a lower-case hex SHA-256", fp)
	}
}

// TestFingerprintV1Recipe pins the v1 recipe. Stores keep fingerprints for
// the TTL of their records, so a change to the recipe that keeps the "v1"
// prefix would refuse every retry in flight during an upgrade as a
// mismatch. The expected value is computed here from the documented recipe.
func TestFingerprintV1Recipe(t *testing.T) {
	t.Parallel()
	h := sha256.New()
	for _, f := range []string{"v1", "POST", "/v1/charges", "a=1&b=x+y", "json", `{"a":[1,"é"],"b":0.5}`} {
		h.Write(binary.AppendUvarint(nil, uint64(len(f))))
		h.Write([]byte(f))
	}
	want := idem.Fingerprint("v1:" + hex.EncodeToString(h.Sum(nil)))
	got := idem.NewFingerprint("POST", "/v1/charges", "b=x%20y&a=1", "application/json", []byte(`{ "b": 5e-1, "a": [1.0, "\u00e9"] }`))
	if got != want {
		t.Errorf("NewFingerprint = %s, want %s", got, want)
	}

	h.Reset()
	for _, f := range []string{"v1", "PUT", "/x", "", "bytes", "raw body"} {
		h.Write(binary.AppendUvarint(nil, uint64(len(f))))
		h.Write([]byte(f))
	}
	want = idem.Fingerprint("v1:" + hex.EncodeToString(h.Sum(nil)))
	if got := idem.NewFingerprint("PUT", "/x", "", "text/plain", []byte("raw body")); got != want {
		t.Errorf("NewFingerprint of bytes = %s, want %s", got, want)
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func BenchmarkFingerprint(b *testing.B) {
	body := []byte(`{"account_id":"acct_0123456789","amount":12000,"currency":"KRW","description":"order 42"}`)
	b.ReportAllocs()
	for b.Loop() {
		idem.NewFingerprint("POST", "/v1/payments", "", "application/json", body)
	}
}

// Fingerprints are stored with keys: the v1 recipe must not change, or a
// retry after an upgrade would be refused as a different request.
func TestFingerprintV1Stable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		method, path, query, contentType, body string
		want                                   idem.Fingerprint
	}{
		{"POST", "/v1/payments", "b=2&a=1", "application/json", `{"b":1, "a":[1,2]}`,
			"v1:df98298cd9e62e0058fc448567465066f217bb8f20d43600154e36b7abeb80d7"},
		{"PUT", "/x", "", "text/plain", "hello",
			"v1:e57132e7695e760dc38013ebf7649e27b21aeee6ee29073f293e1a040f1d95e9"},
		{"POST", "/y", "", "", "not json",
			"v1:763707fa97080029a076fefe62c95c0dcf4a91104eb61436d713072419d8bbf1"},
	} {
		if got := idem.NewFingerprint(tt.method, tt.path, tt.query, tt.contentType, []byte(tt.body)); got != tt.want {
			t.Errorf("NewFingerprint(%s %s?%s, %q) = %s, want %s", tt.method, tt.path, tt.query, tt.body, got, tt.want)
		}
	}
}
