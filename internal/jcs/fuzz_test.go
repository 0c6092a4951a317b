package jcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// Seeds run as ordinary tests with `go test`; more live in
// testdata/fuzz/FuzzCanonicalJSON.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":[1,2,{"d":true,"c":null}],"a":"x"}`,
		`{"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3,"\r":4,"\u0080":5}`,
		`[0,-0,1e21,1e-7,333333333.33333329,5e-324,1.7976931348623157e308,9007199254740993]`,
		`"\u0000\u001f\b\f\n\r\t\"\\\/\u007f\u2028"`,
		` { "a" : { "a" : [ ] } } `,
		`{"a":1,"a":2}`,
		`"\ud800"`,
		`1e400`,
		"\"\xff\"",
		`[1,]`,
		strings.Repeat("[", MaxDepth+1),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonical(in)
		if err != nil {
			if out != nil {
				t.Errorf("returned %q with error %v", out, err)
			}
			if !errors.Is(err, ErrNotCanonicalizable) {
				t.Errorf("error %v does not match ErrNotCanonicalizable", err)
			}
			// A syntax error must be one: encoding/json, which is laxer
			// (it allows invalid UTF-8, lone surrogates, duplicate names
			// and deeper nesting) but has the same grammar, refuses it too.
			var ce *canonicalError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is a %T, not a *canonicalError", err, err)
			}
			if ce.syntax && json.Valid(in) {
				t.Errorf("reported a syntax error for valid JSON %q: %v", in, err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("accepted invalid JSON %q as %q", in, out)
		}
		if !utf8.Valid(out) || !json.Valid(out) {
			t.Fatalf("output %q of %q is not valid UTF-8 JSON", out, in)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, out); err != nil || !bytes.Equal(compact.Bytes(), out) {
			t.Errorf("output %q has insignificant white space", out)
		}
		again, err := Canonical(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Errorf("not idempotent: %q -> %q -> %q, %v", in, out, again, err)
		}
		// Same data: numbers are read back as the same doubles (the
		// output has their shortest round-trip digits, and -0 == 0), and
		// strings and structure are unchanged.
		var vin, vout any
		if err := json.Unmarshal(in, &vin); err != nil {
			t.Fatalf("encoding/json refuses accepted input %q: %v", in, err)
		}
		if err := json.Unmarshal(out, &vout); err != nil {
			t.Fatalf("encoding/json refuses output %q: %v", out, err)
		}
		if !reflect.DeepEqual(vin, vout) {
			t.Errorf("%q and its canonical form %q decode differently:\n%#v\n%#v", in, out, vin, vout)
		}
		checkMemberOrder(t, out)
	})
}

// checkMemberOrder fails t unless every object in the JSON text b has its
// member names in strictly increasing UTF-16 order.
func checkMemberOrder(t *testing.T, b []byte) {
	t.Helper()
	type frame struct {
		object  bool
		wantKey bool
		last    []uint16
		first   bool
	}
	var stack []frame
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("decoding %q: %v", b, err)
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			top := &stack[n-1]
			if top.wantKey {
				if d, ok := tok.(json.Delim); ok && d == '}' {
					stack = stack[:n-1]
					continue
				}
				name := utf16.Encode([]rune(tok.(string)))
				if !top.first && slices.Compare(top.last, name) >= 0 {
					t.Fatalf("in %q, member %q follows %q", b, string(utf16.Decode(name)), string(utf16.Decode(top.last)))
				}
				top.last, top.first, top.wantKey = name, false, false
				continue
			}
			top.wantKey = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{object: true, wantKey: true, first: true})
		case json.Delim('['):
			stack = append(stack, frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
	}
}
