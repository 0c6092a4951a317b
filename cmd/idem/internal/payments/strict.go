package payments

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// errBodyUnreadable marks a request body that could not be read (the
// client's connection failed or timed out). The underlying error names
// the server's socket, so it is logged, never answered.
var errBodyUnreadable = errors.New("the request body could not be read")

// bodyError refuses a body with a detail written for the client: it holds
// only what the client sent, and names the member at fault.
type bodyError struct{ detail string }

func (e *bodyError) Error() string { return e.detail }

// decodeStrict reads one JSON value from body into dst, a pointer to a
// struct, and refuses any body whose meaning could depend on the parser:
//
//   - a member name that is not exactly, case for case, one of the struct's
//     JSON names (encoding/json would match "AMOUNT" or "Amount" to the
//     field "amount", and other parsers would not);
//   - a name given twice in one object, at any depth, exactly or differing
//     only in case (encoding/json keeps the last, others keep the first or
//     refuse);
//   - an unknown name, a second value after the first, trailing garbage.
//
// Refusing is the fix, rather than fingerprinting what was decoded: the
// idempotency middleware fingerprints the canonical form of the body (its
// members sorted by name, RFC 8785-like), so a body and its reordering are
// one request to it, yet with a case-variant duplicate the decoder took
// the last one, and the two meant different amounts. A body that two
// parsers could read differently is refused before anything runs, so no
// parser's reading of it ever becomes a payment, and whatever the
// middleware does with the refusal, nothing is charged.
//
// Errors: an *http.MaxBytesError for a body over the reader's limit,
// errBodyUnreadable (wrapping the read error) for a body that cannot be
// read, a *bodyError, or encoding/json's errors (*json.SyntaxError,
// *json.UnmarshalTypeError, io.EOF for an empty body,
// io.ErrUnexpectedEOF for a truncated one).
func decodeStrict(body io.Reader, dst any) error {
	data, err := io.ReadAll(body)
	if err != nil {
		if isTooLarge(err) {
			return err
		}
		return fmt.Errorf("%w: %w", errBodyUnreadable, err)
	}
	// Reading the first value on its own validates the syntax with
	// encoding/json's own errors, before the member check walks it.
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	if err := dec.Decode(&json.RawMessage{}); err != io.EOF {
		return &bodyError{"the body must hold exactly one JSON value"}
	}
	if err := checkMembers(raw, reflect.TypeOf(dst)); err != nil {
		return err
	}
	// The member check has refused unknown names already; refusing them
	// here too keeps the decoder strict should the two ever disagree.
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

// checkMembers walks data, one syntactically valid JSON value that is to
// be decoded into a t, and refuses with a *bodyError the first member name
// that is not exactly one of its struct's JSON names, or that repeats a
// name of its object exactly or but for case. Objects decoded into a map,
// an interface or a type with its own UnmarshalJSON or UnmarshalText are
// checked for repeated names only.
func checkMembers(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // numbers are skipped, not parsed
	return memberWalk{dec}.value(t, "")
}

type memberWalk struct{ dec *json.Decoder }

func (w memberWalk) value(t reflect.Type, path string) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	t = derefType(t)
	if t != nil && decodesItself(t) {
		t = nil
	}
	switch d {
	case '{':
		return w.object(t, path)
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.value(elem, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err := w.dec.Token()
		return err
	}
	return fmt.Errorf("unexpected %v in a valid JSON value", d)
}

func (w memberWalk) object(t reflect.Type, path string) error {
	var fields *jsonFields
	var elem reflect.Type
	if t != nil {
		switch t.Kind() {
		case reflect.Struct:
			fields = jsonFieldsOf(t)
		case reflect.Map:
			elem = t.Elem()
		}
	}
	seen := make(map[string]string)
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		at := name
		if path != "" {
			at = path + "." + name
		}
		folded := foldName(name)
		if first, ok := seen[folded]; ok {
			if first == name {
				return &bodyError{fmt.Sprintf("field %s appears more than once", quoteName(at))}
			}
			return &bodyError{fmt.Sprintf("field %s repeats %s: names that differ only in case are one field to some JSON parsers",
				quoteName(at), quoteName(first))}
		}
		seen[folded] = name
		if fields != nil {
			ft, ok := fields.exact[name]
			if !ok {
				if known, ok := fields.folded[folded]; ok {
					return &bodyError{fmt.Sprintf("field %s is not known: names are case-sensitive; did you mean %s?", quoteName(at), quoteName(known))}
				}
				return &bodyError{fmt.Sprintf("unknown field %s", quoteName(at))}
			}
			elem = ft
		}
		if err := w.value(elem, at); err != nil {
			return err
		}
	}
	_, err := w.dec.Token()
	return err
}

// jsonFields are the member names encoding/json decodes into a struct:
// exactly, and folded (foldName) to the exact one.
type jsonFields struct {
	exact  map[string]reflect.Type
	folded map[string]string
}

var jsonFieldsCache sync.Map // reflect.Type -> *jsonFields

// jsonFieldsOf returns the JSON names of struct type t as encoding/json
// names them: the tag's name, else the field's; "-" and unexported fields
// left out; the fields of embedded structs promoted, a shallower name
// hiding a deeper one.
func jsonFieldsOf(t reflect.Type) *jsonFields {
	if f, ok := jsonFieldsCache.Load(t); ok {
		return f.(*jsonFields)
	}
	fs := &jsonFields{exact: make(map[string]reflect.Type), folded: make(map[string]string)}
	level := []reflect.Type{t}
	visited := map[reflect.Type]bool{t: true}
	for len(level) > 0 {
		var next []reflect.Type
		names := make(map[string]reflect.Type)
		for _, st := range level {
			for i := range st.NumField() {
				f := st.Field(i)
				tag := f.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				if ft := derefType(f.Type); f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
					if !visited[ft] {
						visited[ft] = true
						next = append(next, ft)
					}
					continue
				}
				if !f.IsExported() {
					continue
				}
				if name == "" {
					name = f.Name
				}
				if _, shallower := fs.exact[name]; !shallower {
					names[name] = f.Type
				}
			}
		}
		for name, ft := range names {
			fs.exact[name] = ft
			fs.folded[foldName(name)] = name
		}
		level = next
	}
	f, _ := jsonFieldsCache.LoadOrStore(t, fs)
	return f.(*jsonFields)
}

func derefType(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decodesItself reports whether t reads its own JSON, so that its names
// are its business (they are still checked for repeats).
func decodesItself(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(jsonUnmarshalerType) || pt.Implements(jsonUnmarshalerType) ||
		t.Implements(textUnmarshalerType) || pt.Implements(textUnmarshalerType)
}

// foldName folds name the way encoding/json matches names to fields
// (bytes.EqualFold): every rune to the smallest of its case-folding orbit,
// so that "AMOUNT", "amount" and "Amount" fold alike, and so do "s", "S"
// and U+017F LATIN SMALL LETTER LONG S.
func foldName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for _, r := range name {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b.WriteByte(byte(r))
			continue
		}
		for {
			f := unicode.SimpleFold(r)
			if f <= r {
				r = f
				break
			}
			r = f
		}
		b.WriteRune(r)
	}
	return b.String()
}

// quoteName quotes a member name (or path) for a problem detail, cut short
// so that a huge name does not make a huge answer.
func quoteName(s string) string {
	const limit = 64
	if len(s) <= limit {
		return strconv.Quote(s)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}
