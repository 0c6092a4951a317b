package jcs

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf16"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		// RFC 8785 section 3.2.2: numbers, string escaping and member
		// order in one document.
		{
			name: "rfc8785 example",
			in: `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`,
			want: `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		// RFC 8785 section 3.2.3: member names sort as UTF-16 code units,
		// so U+1F600 (surrogates D83D DE00) sorts before U+FB33 although
		// its UTF-8 bytes sort after.
		{
			name: "rfc8785 sorting example",
			in: `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`,
			want: "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
		{
			name: "utf16 order differs from utf8 order",
			in:   "{\"\uffff\":1,\"\U0001F600\":2,\"\u20ac\":3}",
			want: "{\"€\":3,\"😀\":2,\"\uffff\":1}",
		},
		{name: "literal supplementary and escaped pair are one name", in: "{\"\U0001F600\":1,\"b\":2}", want: "{\"b\":2,\"😀\":1}"},
		{name: "prefix sorts first", in: `{"ab":1,"a":2,"":3,"b":4,"B":5}`, want: `{"":3,"B":5,"a":2,"ab":1,"b":4}`},
		{name: "nested objects sorted", in: `{"b":{"y":1,"x":[{"d":1,"c":2}]},"a":null}`, want: `{"a":null,"b":{"x":[{"c":2,"d":1}],"y":1}}`},
		{name: "array order kept", in: `[3, 1, 2]`, want: `[3,1,2]`},
		{name: "white space removed", in: " \t\r\n{ \"a\" : [ 1 , { } , [ ] ] }\n ", want: `{"a":[1,{},[]]}`},
		{name: "top-level string", in: `"x"`, want: `"x"`},
		{name: "top-level number", in: ` 42 `, want: `42`},
		{name: "top-level null", in: `null`, want: `null`},
		{name: "top-level true", in: `true`, want: `true`},
		{name: "top-level false", in: `false`, want: `false`},
		{name: "empty string", in: `""`, want: `""`},

		// Strings: only '"', '\\' and control characters are escaped.
		{name: "short escapes kept", in: `"\b\f\n\r\t"`, want: `"\b\f\n\r\t"`},
		{name: "u escapes of short-escape chars", in: `"\u0008\u000c\u000A\u000D\u0009"`, want: `"\b\f\n\r\t"`},
		{name: "other controls lower-case hex", in: `"\u0000\u001F\u000b\u001a"`, want: `"\u0000\u001f\u000b\u001a"`},
		{name: "solidus unescaped", in: `"a\/b/c"`, want: `"a/b/c"`},
		{name: "quote and backslash", in: `"\"\\\u0022\u005C"`, want: `"\"\\\"\\"`},
		{name: "DEL literal", in: `"\u007f"`, want: "\"\x7f\""},
		{name: "non-ASCII literal", in: `"\u00e9\u2028\u2029\uFEFF"`, want: "\"é\u2028\u2029\ufeff\""},
		{name: "surrogate pair decoded", in: `"\uD83D\uDE00"`, want: `"😀"`},
		// The ends of the surrogate ranges: D800 DC00 is U+10000, DBFF DFFF is
		// U+10FFFF, both valid pairs.
		{name: "space and DEL after an escape kept", in: "\"a\\tb c\x7f\"", want: "\"a\\tb c\x7f\""},
		{name: "lowest surrogate pair", in: `"\ud800\udc00"`, want: "\"\U00010000\""},
		{name: "highest surrogate pair", in: `"\uDBFF\uDFFF"`, want: "\"\U0010FFFF\""},
		{name: "every hex digit in u escapes", in: `"\u0123\u4567\u89ab\ucdef\u89AB\uCDEF"`, want: "\"\u0123\u4567\u89ab\ucdef\u89ab\ucdef\""},
		{name: "raw UTF-8 kept", in: `"żółć 😀"`, want: `"żółć 😀"`},
		{name: "noncharacter kept", in: `"\uffff\ufdd0"`, want: "\"\uffff\ufdd0\""},
		{name: "no unicode normalisation", in: `["\u00e9","e\u0301"]`, want: "[\"é\",\"e\u0301\"]"},
		{name: "escaped names sorted decoded", in: `{"\u0062":1,"a":2}`, want: `{"a":2,"b":1}`},

		// Numbers: ECMAScript Number.prototype.toString.
		{name: "zero", in: `0`, want: `0`},
		{name: "negative zero", in: `-0`, want: `0`},
		{name: "negative zero fraction", in: `-0.0e10`, want: `0`},
		{name: "trailing zeros", in: `4.50`, want: `4.5`},
		{name: "integer valued fraction", in: `1.000`, want: `1`},
		{name: "exponent folded", in: `12E-1`, want: `1.2`},
		{name: "1e21", in: `1e21`, want: `1e+21`},
		{name: "1e20 plain", in: `1e20`, want: `100000000000000000000`},
		{name: "1e-6 plain", in: `1e-6`, want: `0.000001`},
		{name: "1e-7", in: `1e-7`, want: `1e-7`},
		{name: "1.5e-7", in: `0.00000015`, want: `1.5e-7`},
		{name: "negative exponent form", in: `-1.5E+300`, want: `-1.5e+300`},
		{name: "333333333.3333333", in: `333333333.33333329`, want: `333333333.3333333`},
		{name: "min subnormal", in: `5e-324`, want: `5e-324`},
		{name: "rounds to min subnormal", in: `3e-324`, want: `5e-324`},
		{name: "max double", in: `1.7976931348623157e308`, want: `1.7976931348623157e+308`},
		{name: "2^53+1 rounds", in: `9007199254740993`, want: `9007199254740992`},
		{name: "2^53", in: `9007199254740992`, want: `9007199254740992`},
		{name: "2^64", in: `18446744073709551616`, want: `18446744073709552000`},
		{name: "excess digits", in: `0.10000000000000000001`, want: `0.1`},
		{name: "underflow to zero", in: `1e-400`, want: `0`},
		{name: "huge exponent of zero", in: `0e999999999999`, want: `0`},
		{name: "long mantissa", in: "1" + strings.Repeat("0", 300), want: `1e+300`},
		{name: "money", in: `[10.00, 0.1, 99.99, 1234567.89]`, want: `[10,0.1,99.99,1234567.89]`},
		{name: "numbers as member values", in: `{"b":-1e-7,"a":1E+2}`, want: `{"a":100,"b":-1e-7}`},
		{name: "at max depth", in: strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), want: strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonical([]byte(tt.in))
			if err != nil {
				t.Fatalf("Canonical(%q): %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonical(%q)\n got %s\nwant %s", tt.in, got, tt.want)
			}
			again, err := Canonical(got)
			if err != nil || string(again) != string(got) {
				t.Errorf("not idempotent: Canonical(%q) = %q, %v", got, again, err)
			}
		})
	}
}

func TestCanonicalJSONErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		// reason is a fragment the message must contain.
		reason string
		syntax bool
	}{
		{name: "empty", in: ``, reason: "unexpected end of input", syntax: true},
		{name: "only white space", in: " \n\t", reason: "unexpected end of input", syntax: true},
		{name: "duplicate name", in: `{"a":1,"b":2,"a":3}`, reason: `member name "a" more than once`},
		{name: "duplicate after unescaping", in: `{"a":1,"\u0061":2}`, reason: `member name "a" more than once`},
		{name: "duplicate nested", in: `[{"x":{"k":1,"k":1}}]`, reason: `"k" more than once`},
		{name: "duplicate long name cut", in: `{"` + strings.Repeat("n", 100) + `":1,"` + strings.Repeat("n", 100) + `":2}`, reason: `"` + strings.Repeat("n", 40) + `"…`},
		{name: "trailing garbage", in: `{"a":1} x`, reason: "unexpected character 'x' after the top-level value", syntax: true},
		{name: "two values", in: `{}{}`, reason: "after the top-level value", syntax: true},
		{name: "two numbers", in: `1 2`, reason: "after the top-level value", syntax: true},
		{name: "invalid UTF-8 in string", in: "\"a\xffb\"", reason: "not valid UTF-8"},
		{name: "invalid UTF-8 after escape", in: "\"\\n\xc3\"", reason: "not valid UTF-8"},
		{name: "UTF-8 encoded surrogate", in: "\"\xed\xa0\x80\"", reason: "not valid UTF-8"},
		{name: "invalid UTF-8 outside string", in: "\xff", reason: "byte 0xFF", syntax: true},
		{name: "DEL outside string named by its byte", in: "\x7f", reason: "unexpected byte 0x7F", syntax: true},
		{name: "tilde outside string named as a character", in: "~", reason: "unexpected character '~'", syntax: true},
		{name: "lone continuation byte in string", in: "\"a\x80\"", reason: "not valid UTF-8"},
		{name: "duplicate name of exactly 40 bytes quoted whole", in: `{"` + strings.Repeat("n", 40) + `":1,"` + strings.Repeat("n", 40) + `":2}`, reason: `name "` + strings.Repeat("n", 40) + `" more than once`},
		// The cut falls inside a two-byte character: the message keeps
		// whole characters (39 bytes), never half of one.
		{name: "duplicate long name cut between characters", in: `{"a` + strings.Repeat("é", 50) + `":1,"a` + strings.Repeat("é", 50) + `":2}`, reason: `name "a` + strings.Repeat("é", 19) + `"… more than once`},
		{name: "overflow of exactly 40 characters shown whole", in: "1" + strings.Repeat("0", 35) + "e400", reason: "number 1" + strings.Repeat("0", 35) + "e400 is outside"},
		{name: "overflow of 41 characters cut", in: "1" + strings.Repeat("0", 36) + "e400", reason: "number 1" + strings.Repeat("0", 36) + "e40… is outside"},
		{name: "end of input after a complete u escape", in: `"\u0041`, reason: "string has no closing quote", syntax: true},
		{name: "byte order mark", in: "\ufeff{}", reason: "byte 0xEF", syntax: true},
		{name: "lone high surrogate", in: `"\ud800"`, reason: "high surrogate"},
		{name: "high surrogate then char", in: `"\uD83Dx"`, reason: "high surrogate"},
		{name: "high surrogate then BMP escape", in: `"\ud83d\u0041"`, reason: "high surrogate"},
		{name: "two high surrogates", in: `"\ud83d\ud83d"`, reason: "high surrogate"},
		{name: "lone low surrogate", in: `"\ude00"`, reason: "low surrogate"},
		{name: "reversed pair", in: `"\ude00\ud83d"`, reason: "low surrogate"},
		{name: "lone surrogate in name", in: `{"\udfff":1}`, reason: "low surrogate"},
		{name: "overflow", in: `1e400`, reason: "outside the range of an IEEE-754 double"},
		{name: "negative overflow", in: `[-1e400]`, reason: "outside the range"},
		{name: "overflow by rounding", in: `1.7976931348623159e308`, reason: "outside the range"},
		{name: "too deep arrays", in: strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), reason: "nesting deeper than 1000 levels"},
		{name: "too deep objects", in: strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1), reason: "nesting deeper"},
		{name: "too deep unterminated", in: strings.Repeat("[", 100000), reason: "nesting deeper"},
		{name: "trailing comma array", in: `[1,]`, reason: "unexpected character ']'", syntax: true},
		{name: "trailing comma object", in: `{"a":1,}`, reason: "expected a member name", syntax: true},
		{name: "missing comma", in: `[1 2]`, reason: "expected ',' or ']'", syntax: true},
		{name: "missing colon", in: `{"a" 1}`, reason: "expected ':'", syntax: true},
		{name: "unquoted name", in: `{a:1}`, reason: "expected a member name", syntax: true},
		{name: "single quotes", in: `'a'`, reason: "unexpected character '\\''", syntax: true},
		{name: "leading zero", in: `01`, reason: "after the top-level value", syntax: true},
		{name: "bare decimal point", in: `1.`, reason: "after a decimal point", syntax: true},
		{name: "leading decimal point", in: `.5`, reason: "expected a value", syntax: true},
		{name: "plus sign", in: `+1`, reason: "expected a value", syntax: true},
		{name: "lone minus", in: `-`, reason: "expected a digit", syntax: true},
		{name: "empty exponent", in: `1e`, reason: "in an exponent", syntax: true},
		{name: "signed empty exponent", in: `1e+`, reason: "in an exponent", syntax: true},
		{name: "NaN", in: `NaN`, reason: "expected a value", syntax: true},
		{name: "Infinity", in: `-Infinity`, reason: "expected a digit", syntax: true},
		{name: "truncated literal", in: `tru`, reason: `expected "true"`, syntax: true},
		{name: "misspelt literal", in: `nul1`, reason: `expected "null"`, syntax: true},
		{name: "unterminated string", in: `"abc`, reason: "no closing quote", syntax: true},
		{name: "unterminated string after escape", in: `"a\n`, reason: "no closing quote", syntax: true},
		{name: "unterminated array", in: `[1`, reason: "unexpected end of input in an array", syntax: true},
		{name: "unterminated object", in: `{"a":1`, reason: "unexpected end of input in an object", syntax: true},
		{name: "raw control character", in: "\"a\x01\"", reason: "control character 0x01", syntax: true},
		{name: "raw newline", in: "\"a\nb\"", reason: "control character 0x0A", syntax: true},
		{name: "lowest lone low surrogate", in: `"\udc00"`, reason: "is a low surrogate without a high surrogate"},
		{name: "non-ASCII continuation byte after an escape", in: "\"\\n\x80\"", reason: "not valid UTF-8"},
		{name: "invalid escape of a space", in: `"\ "`, reason: `invalid escape sequence \character ' '`, syntax: true},
		{name: "invalid escape", in: `"\q"`, reason: `invalid escape sequence \character 'q'`, syntax: true},
		{name: "short u escape", in: `"\u12"`, reason: "four hex digits", syntax: true},
		{name: "non-hex u escape", in: `"\u12g4"`, reason: "four hex digits", syntax: true},
		{name: "escape at end", in: `"\`, reason: "inside an escape sequence", syntax: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Canonical([]byte(tt.in))
			if err == nil {
				t.Fatalf("Canonical(%q) = %q, want an error", tt.in, got)
			}
			if got != nil {
				t.Errorf("Canonical(%q) returned %q with its error", tt.in, got)
			}
			if !errors.Is(err, ErrNotCanonicalizable) {
				t.Errorf("error %v does not match ErrNotCanonicalizable", err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not say %q", err, tt.reason)
			}
			var ce *canonicalError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is a %T, not a *canonicalError", err, err)
			}
			if ce.syntax != tt.syntax {
				t.Errorf("error %q: syntax = %v, want %v", err, ce.syntax, tt.syntax)
			}
		})
	}
}

// TestCanonicalJSONTruncated protects the parser's bounds checks: a body
// cut anywhere (a request whose body was truncated in transit) is refused
// with an error located within what was received, never read past its end,
// and never accepted unless the cut happens to leave valid JSON.
func TestCanonicalJSONTruncated(t *testing.T) {
	t.Parallel()
	docs := []string{
		`{"a":[1,-2.5e+3,true,false,null,{},[],"x\u00e9\ud83d\ude00\n"],"b":{"c":"d"}}`,
		`[{"k":"v\"w"},[[]],{"":{}}, 0.5 ,"\u0041\t"]`,
		` { "name" : "value" , "n" : [ 1 , 2 ] } `,
		`"\uD83D\uDE00"`,
	}
	for _, doc := range docs {
		for n := 0; n < len(doc); n++ {
			in := doc[:n]
			got, err := Canonical([]byte(in))
			if json.Valid([]byte(in)) {
				if err != nil {
					t.Errorf("Canonical(%q), valid JSON: %v", in, err)
				}
				continue
			}
			var ce *canonicalError
			if !errors.As(err, &ce) {
				t.Errorf("Canonical(%q) = %q, %v; want a *canonicalError", in, got, err)
				continue
			}
			if ce.offset > n {
				t.Errorf("Canonical(%q): %v; want an offset up to %d", in, err, n)
			}
		}
	}
}

// TestStringWithoutEscapesNotCopied protects the parser's fast path: a
// string with no escapes is located in the input, not copied into the
// parser's buffer of decoded strings.
func TestStringWithoutEscapesNotCopied(t *testing.T) {
	t.Parallel()
	p := &jsonParser{s: []byte(`"plain żółć"`)}
	sp, err := p.string()
	if err != nil {
		t.Fatal(err)
	}
	if sp&spanDecoded != 0 || len(p.buf) != 0 {
		t.Errorf("a string without escapes was copied: span %#x, buffer %q", uint64(sp), p.buf)
	}
	if got := string(p.text(sp)); got != "plain żółć" {
		t.Errorf("text = %q, want %q", got, "plain żółć")
	}
}

func TestCanonicalJSONErrorOffset(t *testing.T) {
	t.Parallel()
	_, err := Canonical([]byte(`{"a": [1, 2, x]}`))
	if err == nil || !strings.Contains(err.Error(), "at byte offset 13") {
		t.Errorf("error %v does not give the offset 13 of 'x'", err)
	}
}

// TestES6NumberRFC8785 checks the IEEE-754 values of RFC 8785 Appendix B,
// given by their bits so that no parsing is involved.
func TestES6NumberRFC8785(t *testing.T) {
	t.Parallel()
	tests := []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, tt := range tests {
		f := math.Float64frombits(tt.bits)
		if got := string(appendES6Number(nil, f)); got != tt.want {
			t.Errorf("%#016x (%v): got %s, want %s", tt.bits, f, got, tt.want)
		}
		// The same value reached through the parser.
		in := strconv.FormatFloat(f, 'g', -1, 64)
		if got, err := Canonical([]byte(in)); err != nil || string(got) != tt.want {
			t.Errorf("Canonical(%s) = %s, %v; want %s", in, got, err, tt.want)
		}
	}
}

// TestES6NumberRoundTrip checks, over many random doubles, the properties
// the layout must keep: the text parses back to the same double, uses the
// shortest digits, and is in exponent form exactly outside [1e-6, 1e21).
func TestES6NumberRoundTrip(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		f := math.Float64frombits(rng.Uint64())
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		got := string(appendES6Number(nil, f))
		back, err := strconv.ParseFloat(got, 64)
		if err != nil || back != f {
			t.Fatalf("%v: %s parses back as %v, %v", f, got, back, err)
		}
		abs := math.Abs(f)
		wantExp := f != 0 && (abs < 1e-6 || abs >= 1e21)
		if hasExp := strings.Contains(got, "e"); hasExp != wantExp {
			t.Fatalf("%v: %s, exponent form %v, want %v", f, got, hasExp, wantExp)
		}
		if wantExp {
			// Exponent form has the same digits as Go's shortest 'e'
			// form, with the exponent unpadded and '+' kept.
			g := strconv.FormatFloat(f, 'e', -1, 64)
			mant, exp, _ := strings.Cut(g, "e")
			n, _ := strconv.Atoi(exp)
			want := mant + "e" + map[bool]string{true: "+", false: ""}[n >= 0] + strconv.Itoa(n)
			if got != want {
				t.Fatalf("%v: got %s, want %s", f, got, want)
			}
		}
	}
}

func TestCompareUTF16(t *testing.T) {
	t.Parallel()
	ref := func(a, b string) int {
		return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
	}
	sign := func(n int) int {
		switch {
		case n < 0:
			return -1
		case n > 0:
			return 1
		}
		return 0
	}
	pairs := [][2]string{
		{"", ""}, {"", "a"}, {"a", "b"}, {"ab", "a"}, {"\u20ac", "\U0001F600"},
		{"\uffff", "\U0001F600"}, {"\ud7ff", "\U00010000"}, {"\ue000", "\U0010FFFF"},
		{"\U0001F600", "\U0001F601"}, {"\U0001F600", "\U0002F600"}, {"x\u00e9", "x\u00ea"},
		{"\u0080", "\u07ff"}, {"a\U0001F600", "a\uFB33"},
	}
	// Random strings drawn from the ranges where the orders differ.
	rng := rand.New(rand.NewPCG(3, 4))
	pick := []rune{'a', 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfb33, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	for range 5000 {
		var a, b []rune
		for range rng.IntN(4) {
			a = append(a, pick[rng.IntN(len(pick))])
		}
		b = append(b, a[:rng.IntN(len(a)+1)]...)
		for range rng.IntN(3) {
			b = append(b, pick[rng.IntN(len(pick))])
		}
		pairs = append(pairs, [2]string{string(a), string(b)})
	}
	for _, p := range pairs {
		for _, q := range [][2]string{p, {p[1], p[0]}} {
			if got, want := sign(compareUTF16([]byte(q[0]), []byte(q[1]))), ref(q[0], q[1]); got != want {
				t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", q[0], q[1], got, want)
			}
		}
	}
}

// paymentBody is a ~1 KB request body of the kind the middleware sees.
const paymentBody = `{
  "amount": 129900,
  "currency": "eur",
  "description": "Order #10293 — 3 items, express shipping",
  "customer": {
    "id": "cus_9s6XKzkNRiz8i3",
    "email": "jane.doe@example.com",
    "name": "Jane Doe",
    "address": {"line1": "Hauptstraße 5", "line2": null, "city": "Berlin", "postal_code": "10115", "country": "DE"}
  },
  "payment_method": {"type": "card", "card": {"brand": "visa", "last4": "4242", "exp_month": 12, "exp_year": 2030}},
  "items": [
    {"sku": "SKU-1001", "name": "Espresso beans 1kg", "quantity": 2, "unit_price": 2450, "tax_rate": 0.07},
    {"sku": "SKU-2040", "name": "Milk frother", "quantity": 1, "unit_price": 5990, "tax_rate": 0.19},
    {"sku": "SKU-3300", "name": "Gift card \"Coffee lover\"", "quantity": 1, "unit_price": 2500, "tax_rate": 0}
  ],
  "shipping": {"method": "express", "price": 1000, "eta_days": 1.5},
  "metadata": {"order_id": "10293", "channel": "web", "campaign": "spring\/2025", "note": "Leave at the door\nThanks!"},
  "capture": true,
  "statement_descriptor": "ACME COFFEE",
  "risk_score": 1.2e-3,
  "created": 1735689600
}`

func BenchmarkCanonicalJSON(b *testing.B) {
	in := []byte(paymentBody)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalJSONHostile measures a 1 MiB body (the middleware's
// default cap) built to be expensive: hundreds of thousands of nested
// containers, and unsorted objects nested to the depth limit.
func BenchmarkCanonicalJSONHostile(b *testing.B) {
	var nest strings.Builder
	// With the outer array and the innermost "b", MaxDepth deep.
	for range MaxDepth - 2 {
		nest.WriteString(`{"b":[],"a":`)
	}
	nest.WriteString("0")
	nest.WriteString(strings.Repeat("}", MaxDepth-2))
	var in strings.Builder
	in.WriteString("[")
	for in.Len() < 1<<20-2*MaxDepth-16 {
		in.WriteString(strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + ",")
		in.WriteString(nest.String() + ",")
	}
	in.WriteString("0]")
	body := []byte(in.String())
	if _, err := Canonical(body); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonical(body); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAppendCanonicalReusesParsers canonicalises, one after another so
// that each call takes the parser the previous one gave back, inputs that
// leave different things in it (strings with escapes, an error halfway
// through an object, a body too big to keep), and checks every answer
// against a parser used once.
func TestAppendCanonicalReusesParsers(t *testing.T) {
	var big strings.Builder
	big.WriteString("[")
	for i := range 3000 {
		fmt.Fprintf(&big, `{"b\u0062":%d,"a":"x\ty"},`, i)
	}
	big.WriteString("0]")
	inputs := []string{
		`{"b":"\u00e9\n","a":[1,2,{"d":"\"","c":null}]}`,
		`{"z":1,"y":{"x":"\u0041","w":`, // ends inside an object
		`{"a":1,"a":2}`,
		paymentBody,
		big.String(),
		`"\ud83d\ude00"`,
		`{"k":"v"}`,
		`[1e400]`,
		`{}`,
	}
	// A parser used once, never taken from the pool nor given back.
	fresh := func(in []byte) ([]byte, error) { return new(jsonParser).appendCanonical(nil, in) }
	// The same from several goroutines at once: each call owns the
	// parser it took (go test -race watches).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i, in := range inputs {
				want, wantErr := fresh([]byte(in))
				got, err := AppendCanonical(nil, []byte(in))
				if fmt.Sprint(err) != fmt.Sprint(wantErr) || string(got) != string(want) {
					t.Errorf("concurrent, input %d: got %.80q, %v; want %.80q, %v", i, got, err, want, wantErr)
				}
			}
		})
	}
	wg.Wait()
	for round := range 3 {
		for i, in := range inputs {
			want, wantErr := fresh([]byte(in))
			got, err := AppendCanonical([]byte("prefix:"), []byte(in))
			if fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("round %d, input %d: error %v, want %v", round, i, err, wantErr)
			}
			if err != nil {
				if string(got) != "prefix:" {
					t.Errorf("round %d, input %d: failed call returned %q, want dst unchanged", round, i, got)
				}
				continue
			}
			if string(got) != "prefix:"+string(want) {
				t.Errorf("round %d, input %d: got %.80q, want %.80q", round, i, got, "prefix:"+string(want))
			}
		}
	}
}

// TestReleaseKeepsParsersWithinTheLimits protects the pool's bounds: a
// parser is emptied and given back while it holds at most keptChunks
// chunks, keptBuf bytes of buffer and keptMembers members; one grown past
// any of them is dropped as it is (so the pool holds only what small bodies
// need).
func TestReleaseKeepsParsersWithinTheLimits(t *testing.T) {
	tests := []struct {
		name string
		p    *jsonParser
		kept bool
	}{
		{"at every limit", &jsonParser{chunks: make([][]jsonNode, keptChunks), buf: make([]byte, 0, keptBuf), members: make([]int32, 0, keptMembers)}, true},
		{"a chunk too many", &jsonParser{chunks: make([][]jsonNode, keptChunks+1)}, false},
		{"a buffer byte too many", &jsonParser{buf: make([]byte, 0, keptBuf+1)}, false},
		{"a member too many", &jsonParser{members: make([]int32, 0, keptMembers+1)}, false},
	}
	for _, tt := range tests {
		tt.p.s, tt.p.nodes = []byte("input"), 3
		tt.p.release()
		if emptied := tt.p.s == nil && tt.p.nodes == 0; emptied != tt.kept {
			t.Errorf("%s: emptied for the pool = %v, want %v", tt.name, emptied, tt.kept)
		}
	}
}
