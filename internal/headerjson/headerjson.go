// Package headerjson decodes the HTTP header that the SQL stores keep with a
// completed key, a JSON object of arrays of strings as encoding/json writes
// an http.Header, and PostgreSQL's jsonb gives it back.
//
// Every replay read from a store decodes one, and encoding/json's
// reflection costs more than the rest of the replay's work in the process.
// Decode reads the usual header (names and values without escapes) in one
// pass with no reflection, and hands anything else to encoding/json, so its
// answer is always encoding/json's.
package headerjson

import (
	"bytes"
	"encoding/json"
	"net/http"
	"unicode/utf8"
)

// Decode returns the header b encodes: what json.Unmarshal of b into an
// http.Header returns, error included.
func Decode(b []byte) (http.Header, error) {
	if h, ok := decodePlain(b); ok {
		return h, nil
	}
	var h http.Header
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	return h, nil
}

// decodePlain decodes b when it is an object of arrays of strings that
// hold no escape, no control character and only valid UTF-8, which is
// what a header usually is. ok is false for anything else (an escape,
// null, a number, a syntax error), which encoding/json then decides.
func decodePlain(b []byte) (h http.Header, ok bool) {
	// Names and values are cut from one copy of b: one allocation for
	// every string.
	d := plainDecoder{b: b, s: string(b)}
	if !d.byte('{') {
		return nil, false
	}
	h = make(http.Header, bytes.Count(b, []byte{'['}))
	if d.byte('}') {
		return h, d.end()
	}
	for {
		name, ok := d.str()
		if !ok || !d.byte(':') || !d.byte('[') {
			return nil, false
		}
		values := make([]string, 0, 1)
		if !d.byte(']') {
			for {
				v, ok := d.str()
				if !ok {
					return nil, false
				}
				values = append(values, v)
				if d.byte(']') {
					break
				}
				if !d.byte(',') {
					return nil, false
				}
			}
		}
		// A repeated name keeps its last values, as encoding/json does.
		h[name] = values
		if d.byte('}') {
			return h, d.end()
		}
		if !d.byte(',') {
			return nil, false
		}
	}
}

type plainDecoder struct {
	b   []byte
	s   string // b's copy
	pos int
}

// space skips JSON whitespace.
func (d *plainDecoder) space() {
	for d.pos < len(d.b) {
		switch d.b[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// byte consumes c, after whitespace, if it comes next.
func (d *plainDecoder) byte(c byte) bool {
	d.space()
	if d.pos < len(d.b) && d.b[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

// str consumes a string without escapes or control characters, of valid
// UTF-8.
func (d *plainDecoder) str() (string, bool) {
	if !d.byte('"') {
		return "", false
	}
	start := d.pos
	for d.pos < len(d.b) {
		switch c := d.b[d.pos]; {
		case c == '"':
			s := d.s[start:d.pos]
			d.pos++
			if !utf8.ValidString(s) {
				return "", false
			}
			return s, true
		case c == '\\' || c < 0x20:
			return "", false
		}
		d.pos++
	}
	return "", false
}

// end reports whether only whitespace is left.
func (d *plainDecoder) end() bool {
	d.space()
	return d.pos == len(d.b)
}
