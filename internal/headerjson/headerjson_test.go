package headerjson

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
)

// seeds are headers as encoding/json writes them and as jsonb gives them
// back, and inputs the plain path must leave to encoding/json.
var seeds = []string{
	`{}`,
	`{"Content-Type":["application/json"]}`,
	`{"Content-Type": ["application/json"], "Location": ["/v1/payments/pay_1"]}`,
	`{"Set-Cookie": ["a=1", "b=2"], "X-Empty": [""], "X-None": []}`,
	` { "A" : [ "x" , "y" ] } `,
	`{"A": ["1"], "A": ["2"]}`,
	`{"Caf\u00e9": ["\"quoted\""]}`,
	`{"Ünïcode": ["✓"]}`,
	`{"A": null}`,
	`null`,
	`{"A": "not an array"}`,
	`{"A": [1]}`,
	`{"A": ["x"]`,
	`{"A": ["x"]} trailing`,
	"{\"A\": [\"\xff\"]}",
	"{\"A\": [\"tab\there\"]}",
	``,
}

func FuzzDecode(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Decode(b)
		var want http.Header
		wantErr := json.Unmarshal(b, &want)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("Decode(%q) error = %v, json.Unmarshal's = %v", b, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("Decode(%q) = %#v, json.Unmarshal gives %#v", b, got, want)
		}
	})
}

// TestPlainPath checks that the usual headers take the plain path, and
// that the unusual ones do not.
func TestPlainPath(t *testing.T) {
	for _, s := range []string{
		`{}`,
		`{"Content-Type": ["application/json"], "Location": ["/v1/payments/pay_1"]}`,
		`{"Set-Cookie": ["a=1", "b=2"], "X-None": []}`,
	} {
		if _, ok := decodePlain([]byte(s)); !ok {
			t.Errorf("decodePlain(%s) left it to encoding/json", s)
		}
	}
	for _, s := range []string{`{"A": "\u00e9"}`, `null`, `{"A": [1]}`, "{\"A\": [\"\xff\"]}", `{"A": ["x"]} x`} {
		if _, ok := decodePlain([]byte(s)); ok {
			t.Errorf("decodePlain(%s) decoded it", s)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	in := []byte(`{"Content-Type": ["application/json"], "Location": ["/v1/payments/pay_1"]}`)
	b.Run("headerjson", func(b *testing.B) {
		for b.Loop() {
			if _, err := Decode(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var h http.Header
			if err := json.Unmarshal(in, &h); err != nil {
				b.Fatal(err)
			}
		}
	})
}
