package jcs

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrNotCanonicalizable is matched (with errors.Is) by every error
// Canonical returns: the input is not JSON, or is JSON that RFC 8785
// cannot canonicalise. Callers that only want a stable form of "the same
// body" fall back to the raw bytes, as NewFingerprint does.
var ErrNotCanonicalizable = errors.New("idem: JSON cannot be canonicalised")

// MaxDepth is the deepest nesting of arrays and objects Canonical
// accepts. The parser recurses once per level, so the limit keeps a hostile
// body such as a million '[' from exhausting the stack.
const MaxDepth = 1000

// Canonical returns the RFC 8785 (JSON Canonicalization Scheme, JCS)
// form of the JSON text b: no insignificant white space, object members
// sorted by name compared as UTF-16 code units, strings with the minimal
// escaping of RFC 8785 (only '"', '\\' and control characters; everything
// else literal UTF-8), and numbers written as ECMAScript's
// Number.prototype.toString writes them.
//
// The input is parsed strictly. It must be exactly one JSON value (white
// space around it is allowed), valid UTF-8, and I-JSON (RFC 7493): no two
// members of an object may have the same name once escapes are decoded, \u
// escapes must not leave a lone surrogate, and every number must be a finite
// IEEE-754 double. Nesting deeper than MaxDepth is refused. Any such
// input returns an error matching ErrNotCanonicalizable that says what is
// wrong and at which byte offset; nothing of b is returned with it.
//
// Unicode noncharacters (U+FFFF, U+FDD0 and the like), which RFC 7493 also
// forbids, are accepted and kept as they are: they are valid scalar values
// with a single UTF-8 form, so they cannot make the canonical form
// ambiguous, and refusing them would only lose the canonical form for such
// bodies. Strings are not Unicode-normalised (RFC 8785 leaves them as they
// are), so "é" and "e\u0301" stay different.
//
// Numbers are IEEE-754 doubles, as RFC 8785 requires: each is rounded to the
// nearest double and written with the shortest digits that read back as
// that double. Integers beyond 2^53 and decimals with more than about 17
// significant digits therefore lose precision: 9007199254740993 becomes
// 9007199254740992, and 0.10000000000000000001 becomes 0.1. A number too
// small for a double (1e-400) becomes 0; one too large (1e400) is refused.
// For fingerprints this means two bodies that differ only beyond a double's
// precision (say, a 64-bit ID that differs in its last digit) canonicalise
// alike and share a fingerprint, so reusing a key across them is replayed
// rather than refused. APIs that carry such values should send them as JSON
// strings, which are compared exactly.
func Canonical(b []byte) ([]byte, error) {
	out, err := AppendCanonical(make([]byte, 0, len(b)), b)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AppendCanonical appends the canonical form of b to dst and returns the
// extended slice, as Canonical would return it; on error dst is returned
// as it was, with the error Canonical would return. The parser's working
// memory is reused from call to call, so a small body canonicalised into
// a dst with room for it allocates nothing.
func AppendCanonical(dst, b []byte) ([]byte, error) {
	if len(b) > math.MaxInt32 {
		// Offsets into the input are kept as int32.
		return dst, &canonicalError{reason: "input is larger than 2 GiB"}
	}
	p := parsers.Get().(*jsonParser)
	defer p.release()
	return p.appendCanonical(dst, b)
}

// appendCanonical is AppendCanonical on the empty parser p.
func (p *jsonParser) appendCanonical(dst, b []byte) ([]byte, error) {
	p.s = b
	p.skipSpace()
	root, err := p.value(0)
	if err != nil {
		return dst, err
	}
	p.skipSpace()
	if p.i != len(p.s) {
		return dst, p.syntaxErr(p.i, fmt.Sprintf("unexpected %s after the top-level value", p.describe(p.i)))
	}
	return p.appendNode(dst, root), nil
}

// parsers keeps parsers between calls, with their chunks and buffers.
var parsers = sync.Pool{New: func() any { return new(jsonParser) }}

// Limits on what a parser given back to parsers keeps: a parser that grew
// larger for one big body is dropped instead, so that the pool holds only
// what small bodies need.
const (
	keptChunks  = 1
	keptBuf     = 4 << 10
	keptMembers = 1 << 10
)

// release empties p, forgetting its input, and gives it back to parsers
// unless it grew past the limits above.
func (p *jsonParser) release() {
	if len(p.chunks) > keptChunks || cap(p.buf) > keptBuf || cap(p.members) > keptMembers {
		return
	}
	for i := range p.chunks {
		p.chunks[i] = p.chunks[i][:0]
	}
	p.s, p.i, p.nodes = nil, 0, 0
	p.buf, p.members = p.buf[:0], p.members[:0]
	parsers.Put(p)
}

// jsonKind is the type of a parsed JSON value.
type jsonKind uint8

const (
	jsonNull jsonKind = iota
	jsonFalse
	jsonTrue
	jsonNumber
	jsonString
	jsonArray
	jsonObject
)

// jsonNode is one parsed JSON value. The parser builds a tree (rather than
// writing while it parses) so that every object is sorted once, when its
// members are known, without moving written bytes at each nesting level.
// Nodes are small, link to each other by index and hold no pointers, so
// even a body made of a million tiny values costs little memory and no
// garbage-collector work.
type jsonNode struct {
	// val is, by kind, a number's math.Float64bits, a string's span, or
	// the index of an array's first element or an object's first member
	// (as uint32; -1 when it is empty).
	val uint64
	// name is the span of an object member's name.
	name span
	// next is the index of the following element or member in the parent;
	// -1 for the last.
	next int32
	kind jsonKind
}

func (n *jsonNode) num() float64     { return math.Float64frombits(n.val) }
func (n *jsonNode) str() span        { return span(n.val) }
func (n *jsonNode) first() int32     { return int32(uint32(n.val)) }
func (n *jsonNode) setFirst(i int32) { n.val = uint64(uint32(i)) }

// span locates a string's decoded bytes: in the input when the string had
// no escapes, else in the parser's buffer of decoded strings. Bit 63 says
// which; bits 32 to 62 hold the start offset and bits 0 to 31 the end.
type span uint64

const spanDecoded = 1 << 63

func makeSpan(off, end int, decoded bool) span {
	sp := span(off)<<32 | span(end)
	if decoded {
		sp |= spanDecoded
	}
	return sp
}

// canonicalError is what Canonical returns. syntax tells a text that is
// not JSON at all (RFC 8259) from JSON that only breaks the stricter rules
// canonicalisation needs; tests use the distinction to compare against
// encoding/json.
type canonicalError struct {
	offset int
	reason string
	syntax bool
}

func (e *canonicalError) Error() string {
	return fmt.Sprintf("%v: %s (at byte offset %d)", ErrNotCanonicalizable, e.reason, e.offset)
}

func (e *canonicalError) Unwrap() error { return ErrNotCanonicalizable }

type jsonParser struct {
	s []byte
	i int
	// chunks hold every parsed value, nodeChunk at a time; the tree's
	// links are indices into them. Chunks are never copied to grow, so
	// node n stays at the same place, and a huge body is not copied over
	// and over as one slice would be.
	chunks [][]jsonNode
	nodes  int32
	// buf holds the decoded bytes of strings that had escapes.
	buf []byte
	// members is a stack of the member nodes of the objects being parsed;
	// each object sorts and links its own when it ends.
	members []int32
}

// nodeChunkBits sets the number of nodes in a chunk, 1<<nodeChunkBits.
const nodeChunkBits = 10

// add appends n to the tree and returns its index. The first chunk starts
// small and grows by appending, so a small body allocates little; a parser
// reused from parsers appends to the chunks it kept.
func (p *jsonParser) add(n jsonNode) int32 {
	n.next = -1
	c := int(p.nodes >> nodeChunkBits)
	if c == len(p.chunks) {
		size := 1 << nodeChunkBits
		if c == 0 {
			size = min(size, len(p.s)/8+4)
		}
		p.chunks = append(p.chunks, make([]jsonNode, 0, size))
	}
	p.chunks[c] = append(p.chunks[c], n)
	p.nodes++
	return p.nodes - 1
}

// node returns node i. The pointer is valid until the next add.
func (p *jsonParser) node(i int32) *jsonNode {
	return &p.chunks[i>>nodeChunkBits][i&(1<<nodeChunkBits-1)]
}

// text returns the bytes sp locates.
func (p *jsonParser) text(sp span) []byte {
	off, end := int(sp>>32&(1<<31-1)), int(uint32(sp))
	if sp&spanDecoded != 0 {
		return p.buf[off:end]
	}
	return p.s[off:end]
}

func (p *jsonParser) syntaxErr(off int, reason string) error {
	return &canonicalError{offset: off, reason: reason, syntax: true}
}

func (p *jsonParser) strictErr(off int, reason string) error {
	return &canonicalError{offset: off, reason: reason}
}

// describe names the byte at i for an error message.
func (p *jsonParser) describe(i int) string {
	if i >= len(p.s) {
		return "end of input"
	}
	c := p.s[i]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("character %q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02X", c)
}

func (p *jsonParser) skipSpace() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses the value at p.i and returns its node; depth is the number
// of arrays and objects that enclose it.
func (p *jsonParser) value(depth int) (int32, error) {
	if p.i >= len(p.s) {
		return 0, p.syntaxErr(p.i, "unexpected end of input, expected a value")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		sp, err := p.string()
		if err != nil {
			return 0, err
		}
		return p.add(jsonNode{kind: jsonString, val: uint64(sp)}), nil
	case c == '-' || (c >= '0' && c <= '9'):
		f, err := p.number()
		if err != nil {
			return 0, err
		}
		return p.add(jsonNode{kind: jsonNumber, val: math.Float64bits(f)}), nil
	case c == 't':
		return p.literal("true", jsonTrue)
	case c == 'f':
		return p.literal("false", jsonFalse)
	case c == 'n':
		return p.literal("null", jsonNull)
	default:
		return 0, p.syntaxErr(p.i, fmt.Sprintf("unexpected %s, expected a value", p.describe(p.i)))
	}
}

func (p *jsonParser) literal(word string, kind jsonKind) (int32, error) {
	if len(p.s)-p.i < len(word) || string(p.s[p.i:p.i+len(word)]) != word {
		return 0, p.syntaxErr(p.i, fmt.Sprintf("invalid literal, expected %q", word))
	}
	p.i += len(word)
	return p.add(jsonNode{kind: kind}), nil
}

func (p *jsonParser) tooDeep(depth int) error {
	if depth > MaxDepth {
		return p.strictErr(p.i, fmt.Sprintf("nesting deeper than %d levels", MaxDepth))
	}
	return nil
}

func (p *jsonParser) array(depth int) (int32, error) {
	if err := p.tooDeep(depth); err != nil {
		return 0, err
	}
	p.i++ // '['
	arr := p.add(jsonNode{kind: jsonArray, val: math.MaxUint32})
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return arr, nil
	}
	prev := int32(-1)
	for {
		p.skipSpace()
		e, err := p.value(depth)
		if err != nil {
			return 0, err
		}
		if prev < 0 {
			p.node(arr).setFirst(e)
		} else {
			p.node(prev).next = e
		}
		prev = e
		p.skipSpace()
		if p.i >= len(p.s) {
			return 0, p.syntaxErr(p.i, "unexpected end of input in an array, expected ',' or ']'")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return arr, nil
		default:
			return 0, p.syntaxErr(p.i, fmt.Sprintf("unexpected %s in an array, expected ',' or ']'", p.describe(p.i)))
		}
	}
}

func (p *jsonParser) object(depth int) (int32, error) {
	if err := p.tooDeep(depth); err != nil {
		return 0, err
	}
	start := p.i
	p.i++ // '{'
	obj := p.add(jsonNode{kind: jsonObject, val: math.MaxUint32})
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return obj, nil
	}
	base := len(p.members)
	for {
		p.skipSpace()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return 0, p.syntaxErr(p.i, fmt.Sprintf("unexpected %s in an object, expected a member name", p.describe(p.i)))
		}
		name, err := p.string()
		if err != nil {
			return 0, err
		}
		p.skipSpace()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return 0, p.syntaxErr(p.i, fmt.Sprintf("unexpected %s after a member name, expected ':'", p.describe(p.i)))
		}
		p.i++
		p.skipSpace()
		m, err := p.value(depth)
		if err != nil {
			return 0, err
		}
		p.node(m).name = name
		p.members = append(p.members, m)
		p.skipSpace()
		if p.i >= len(p.s) {
			return 0, p.syntaxErr(p.i, "unexpected end of input in an object, expected ',' or '}'")
		}
		if p.s[p.i] == '}' {
			p.i++
			break
		}
		if p.s[p.i] != ',' {
			return 0, p.syntaxErr(p.i, fmt.Sprintf("unexpected %s in an object, expected ',' or '}'", p.describe(p.i)))
		}
		p.i++
	}
	// Sorting first turns the duplicate check into a comparison of
	// neighbours, with no map to allocate.
	members := p.members[base:]
	slices.SortFunc(members, func(a, b int32) int {
		return compareUTF16(p.text(p.node(a).name), p.text(p.node(b).name))
	})
	p.node(obj).setFirst(members[0])
	for k := 1; k < len(members); k++ {
		name := p.text(p.node(members[k]).name)
		if bytes.Equal(name, p.text(p.node(members[k-1]).name)) {
			return 0, p.strictErr(start, fmt.Sprintf("object has the member name %s more than once", quoteShort(name)))
		}
		p.node(members[k-1]).next = members[k]
	}
	p.members = p.members[:base]
	return obj, nil
}

// quoteShort quotes a member name for an error message, cut short so that a
// huge name does not make a huge error.
func quoteShort(s []byte) string {
	const limit = 40
	if len(s) <= limit {
		return strconv.Quote(string(s))
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(string(s[:cut])) + "…"
}

// string parses the string starting at the '"' at p.i and locates its
// decoded value. A string without escapes is located in the input, so the
// common case copies nothing.
func (p *jsonParser) string() (span, error) {
	start := p.i
	i := p.i + 1
	for i < len(p.s) {
		c := p.s[i]
		if c == '"' {
			p.i = i + 1
			return makeSpan(start+1, i, false), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return 0, p.syntaxErr(i, fmt.Sprintf("control character 0x%02X in a string must be escaped", c))
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(p.s[i:])
		if r == utf8.RuneError && size == 1 {
			return 0, p.strictErr(i, "string is not valid UTF-8")
		}
		i += size
	}
	if i >= len(p.s) {
		return 0, p.syntaxErr(start, "string has no closing quote")
	}
	// Slow path: the string has escapes and needs a decoded copy.
	off := len(p.buf)
	p.buf = append(p.buf, p.s[start+1:i]...)
	for i < len(p.s) {
		c := p.s[i]
		switch {
		case c == '"':
			p.i = i + 1
			return makeSpan(off, len(p.buf), true), nil
		case c == '\\':
			var err error
			if i, err = p.escape(i); err != nil {
				return 0, err
			}
		case c < 0x20:
			return 0, p.syntaxErr(i, fmt.Sprintf("control character 0x%02X in a string must be escaped", c))
		case c < utf8.RuneSelf:
			p.buf = append(p.buf, c)
			i++
		default:
			r, size := utf8.DecodeRune(p.s[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, p.strictErr(i, "string is not valid UTF-8")
			}
			p.buf = append(p.buf, p.s[i:i+size]...)
			i += size
		}
	}
	return 0, p.syntaxErr(start, "string has no closing quote")
}

// escape decodes the escape sequence at p.s[i] (a '\\') onto p.buf and
// returns the index after it.
func (p *jsonParser) escape(i int) (int, error) {
	if i+1 >= len(p.s) {
		return 0, p.syntaxErr(i, "string ends inside an escape sequence")
	}
	switch c := p.s[i+1]; c {
	case '"', '\\', '/':
		p.buf = append(p.buf, c)
	case 'b':
		p.buf = append(p.buf, '\b')
	case 'f':
		p.buf = append(p.buf, '\f')
	case 'n':
		p.buf = append(p.buf, '\n')
	case 'r':
		p.buf = append(p.buf, '\r')
	case 't':
		p.buf = append(p.buf, '\t')
	case 'u':
		r, ok := p.hex4(i + 2)
		if !ok {
			return 0, p.syntaxErr(i, `\u escape must be followed by four hex digits`)
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00:
			// A high surrogate is valid only when a \u low surrogate
			// follows at once.
			if i+7 < len(p.s) && p.s[i+6] == '\\' && p.s[i+7] == 'u' {
				if lo, ok := p.hex4(i + 8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					p.buf = utf8.AppendRune(p.buf, utf16.DecodeRune(r, lo))
					return i + 12, nil
				}
			}
			return 0, p.strictErr(i, fmt.Sprintf(`\u%04x is a high surrogate not followed by a \u escaped low surrogate`, r))
		case utf16.IsSurrogate(r):
			return 0, p.strictErr(i, fmt.Sprintf(`\u%04x is a low surrogate without a high surrogate before it`, r))
		}
		p.buf = utf8.AppendRune(p.buf, r)
		return i + 6, nil
	default:
		return 0, p.syntaxErr(i, fmt.Sprintf(`invalid escape sequence \%s`, p.describe(i+1)))
	}
	return i + 2, nil
}

// hex4 decodes the four hex digits at p.s[i:].
func (p *jsonParser) hex4(i int) (rune, bool) {
	if i+4 > len(p.s) {
		return 0, false
	}
	var r rune
	for _, c := range p.s[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number parses a number with the RFC 8259 grammar and rounds it to the
// nearest double.
func (p *jsonParser) number() (float64, error) {
	start := p.i
	i := p.i
	if p.s[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(p.s) && p.s[i] >= '0' && p.s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(p.s) && p.s[i] == '0':
		i++
	case digits() == 0:
		return 0, p.syntaxErr(i, fmt.Sprintf("unexpected %s in a number, expected a digit", p.describe(i)))
	}
	if i < len(p.s) && p.s[i] == '.' {
		i++
		if digits() == 0 {
			return 0, p.syntaxErr(i, fmt.Sprintf("unexpected %s after a decimal point, expected a digit", p.describe(i)))
		}
	}
	if i < len(p.s) && (p.s[i] == 'e' || p.s[i] == 'E') {
		i++
		if i < len(p.s) && (p.s[i] == '+' || p.s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, p.syntaxErr(i, fmt.Sprintf("unexpected %s in an exponent, expected a digit", p.describe(i)))
		}
	}
	p.i = i
	text := p.s[start:i]
	f, err := strconv.ParseFloat(string(text), 64)
	if err != nil || math.IsInf(f, 0) {
		// The grammar was checked above, so the only failure left is
		// overflow: ParseFloat rounds too-small numbers to zero quietly.
		return 0, p.strictErr(start, fmt.Sprintf("number %s is outside the range of an IEEE-754 double", shortText(text)))
	}
	return f, nil
}

// shortText cuts a number's text for an error message.
func shortText(s []byte) string {
	if len(s) <= 40 {
		return string(s)
	}
	return string(s[:40]) + "…"
}

// appendNode writes the canonical form of the value n.
func (p *jsonParser) appendNode(out []byte, n int32) []byte {
	v := p.node(n)
	switch v.kind {
	case jsonNull:
		return append(out, "null"...)
	case jsonFalse:
		return append(out, "false"...)
	case jsonTrue:
		return append(out, "true"...)
	case jsonNumber:
		return appendES6Number(out, v.num())
	case jsonString:
		return appendJCSString(out, p.text(v.str()))
	case jsonArray:
		out = append(out, '[')
		for e := v.first(); e >= 0; e = p.node(e).next {
			if e != v.first() {
				out = append(out, ',')
			}
			out = p.appendNode(out, e)
		}
		return append(out, ']')
	default: // jsonObject, its members linked in sorted order by object().
		out = append(out, '{')
		for m := v.first(); m >= 0; m = p.node(m).next {
			if m != v.first() {
				out = append(out, ',')
			}
			out = appendJCSString(out, p.text(p.node(m).name))
			out = append(out, ':')
			out = p.appendNode(out, m)
		}
		return append(out, '}')
	}
}

// appendJCSString writes s (valid UTF-8) as RFC 8785 section 3.2.2.2 does:
// '"' and '\\' escaped, the control characters with a short escape where
// JSON has one and \u00xx (lower-case hex) otherwise, everything else as it
// is.
func appendJCSString(out, s []byte) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	last := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[last:i]...)
		last = i + 1
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
	}
	out = append(out, s[last:]...)
	return append(out, '"')
}

// appendES6Number writes the finite double f as ECMAScript's
// Number.prototype.toString does (ECMA-262, Number::toString), which RFC
// 8785 section 3.2.2.3 adopts: the shortest digits that round-trip, laid out
// in plain decimal notation when the decimal exponent is in [-6, 21) and in
// exponent notation ("1e+21", "1.5e-7") otherwise. Negative zero is "0".
func appendES6Number(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0')
	}
	if f < 0 {
		out = append(out, '-')
		f = -f
	}
	if f < 1<<53 && f == math.Trunc(f) {
		// Below 2^53 every integer is a double and no shorter digits
		// round-trip, so the integer is the shortest form.
		return strconv.AppendInt(out, int64(f), 10)
	}
	// 'e' with precision -1 gives the shortest round-trip digits as
	// "d.ddddde±XX"; pull out the digits and the exponent, then lay them
	// out the ECMAScript way.
	var scratch [32]byte
	e := strconv.AppendFloat(scratch[:0], f, 'e', -1, 64)
	var digits [24]byte
	k := 0
	j := 0
	for ; e[j] != 'e'; j++ {
		if e[j] != '.' {
			digits[k] = e[j]
			k++
		}
	}
	exp, _ := strconv.Atoi(string(e[j+1:]))
	// ECMA-262 names: the value is 0.d1d2…dk × 10^n, so n is one more than
	// the scientific exponent.
	n := exp + 1
	d := digits[:k]
	switch {
	case k <= n && n <= 21:
		// Integer: the digits then n-k zeros.
		out = append(out, d...)
		for range n - k {
			out = append(out, '0')
		}
	case 0 < n && n <= 21:
		// The decimal point falls inside the digits.
		out = append(out, d[:n]...)
		out = append(out, '.')
		out = append(out, d[n:]...)
	case -6 < n && n <= 0:
		// A small fraction: "0." then -n zeros then the digits.
		out = append(out, '0', '.')
		for range -n {
			out = append(out, '0')
		}
		out = append(out, d...)
	default:
		out = append(out, d[0])
		if k > 1 {
			out = append(out, '.')
			out = append(out, d[1:]...)
		}
		out = append(out, 'e')
		if n-1 >= 0 {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, int64(n-1), 10)
	}
	return out
}

// compareUTF16 orders two valid UTF-8 strings as their UTF-16 code-unit
// sequences compare, the order RFC 8785 sorts member names by. UTF-8 byte
// order is code-point order, which agrees with UTF-16 order except between
// U+E000..U+FFFF and the supplementary planes: UTF-16 writes the latter as
// surrogates (0xD800..0xDFFF), which sort first.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	// Back up to the start of the rune that differs; the common prefix
	// is the same in both strings, so its rune boundaries are too.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRune(a[i:])
	rb, _ := utf8.DecodeRune(b[i:])
	return int(utf16Key(ra)) - int(utf16Key(rb))
}

// utf16Key maps a rune to a number that orders runes as their UTF-16
// encodings compare: runes below the surrogates first, then the
// supplementary planes (whose high surrogates are 0xD800..0xDBFF), then
// U+E000..U+FFFF.
func utf16Key(r rune) rune {
	switch {
	case r < 0xD800:
		return r
	case r >= 0x10000:
		return 0xD800 + (r - 0x10000)
	default:
		return r + 0x100000
	}
}
