package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"mime"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// span is a piece of a payload with the class that colours it.
type span struct {
	Class string
	Text  string
}

// payloadView is a payload as a page shows it: JSON indented and
// coloured, other text as text, anything else as a hex dump. Invisible
// and control characters are shown as escapes in every form, so that a
// payload cannot disguise what it holds.
type payloadView struct {
	Kind  string // "JSON", "text", "binary" or "empty"
	Spans []span
	Size  int
}

func viewPayload(p []byte) payloadView {
	v := payloadView{Size: len(p)}
	switch {
	case len(p) == 0:
		v.Kind = "empty"
	case json.Valid(p):
		var b bytes.Buffer
		if err := json.Indent(&b, p, "", "  "); err == nil {
			v.Kind, v.Spans = "JSON", colourJSON(b.String())
			return v
		}
		fallthrough
	case printable(p):
		v.Kind, v.Spans = "text", visible(string(p), "")
	default:
		v.Kind, v.Spans = "binary", []span{{Class: "hex", Text: hex.Dump(p)}}
	}
	return v
}

// printable reports whether p is UTF-8 text, mostly made of characters
// that print.
func printable(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	bad := 0
	for _, r := range string(p) {
		if r != '\n' && r != '\r' && r != '\t' && unsafeRune(r) {
			bad++
		}
	}
	return bad*10 <= utf8.RuneCount(p)
}

// unsafeRune is a character that does not show itself: a control
// character, or a format one (bidirectional overrides, zero-width joiners).
func unsafeRune(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// visible splits s into spans of class, with every unsafe character (but
// line breaks and tabs) as an "esc" span showing its escape.
func visible(s, class string) []span {
	var out []span
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || (r != '\n' && r != '\t' && unsafeRune(r)) {
			if b.Len() > 0 {
				out = append(out, span{Class: class, Text: b.String()})
				b.Reset()
			}
			out = append(out, span{Class: "esc", Text: fmt.Sprintf("\\u%04x", r)})
			continue
		}
		b.WriteRune(r)
	}
	if b.Len() > 0 {
		out = append(out, span{Class: class, Text: b.String()})
	}
	return out
}

// colourJSON splits indented, valid JSON into coloured spans: keys,
// strings, numbers, literals and punctuation.
func colourJSON(s string) []span {
	var out []span
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(s) && s[j] != '"' {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(s))
			class := "str"
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\n') {
				k++
			}
			if k < len(s) && s[k] == ':' {
				class = "key"
			}
			out = append(out, visible(s[i:j], class)...)
			i = j
		case c == '-' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(s) && strings.IndexByte("0123456789.eE+-", s[j]) >= 0 {
				j++
			}
			out = append(out, span{Class: "num", Text: s[i:j]})
			i = j
		case c == 't' || c == 'f' || c == 'n':
			j := i
			for j < len(s) && s[j] >= 'a' && s[j] <= 'z' {
				j++
			}
			out = append(out, span{Class: "lit", Text: s[i:j]})
			i = j
		default:
			j := i
			for j < len(s) && strings.IndexByte("{}[],: \n", s[j]) >= 0 {
				j++
			}
			if j == i {
				j++
			}
			out = append(out, span{Class: "punct", Text: s[i:j]})
			i = j
		}
	}
	return out
}

// editable reports whether a payload can be edited as text in a form.
func editable(p []byte) bool { return len(p) == 0 || printable(p) }

// EditableText is a payload as an editor should start with it: JSON
// indented, other text as it is.
func EditableText(p []byte) string {
	var b bytes.Buffer
	if json.Valid(p) && json.Indent(&b, p, "", "  ") == nil {
		return b.String() + "\n"
	}
	return string(p)
}

// wantsJSON reports whether an edit of m's payload must be JSON: unless
// its Content-Type names another type, it must.
func wantsJSON(m idem.Message) bool {
	ct := ""
	for k, v := range m.Headers {
		if strings.EqualFold(k, "Content-Type") {
			ct = v
		}
	}
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err != nil || mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// ErrInvalidPayload is matched by the error EditedPayload returns for an
// edit that must be JSON and is not.
var ErrInvalidPayload = errors.New("console: the edited payload is not valid JSON")

// PayloadError says where an edited payload stops being JSON.
type PayloadError struct {
	// Line and Column (from 1) are where the parser stopped.
	Line, Column int
	// Err is the parser's error.
	Err error
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("the payload is not valid JSON: %v (line %d, column %d)", e.Err, e.Line, e.Column)
}

func (e *PayloadError) Unwrap() []error { return []error{ErrInvalidPayload, e.Err} }

// EditedPayload checks an edit of dl's payload and returns the payload to
// re-drive. Unless the message's Content-Type names a type other than
// JSON, the edit must parse as one JSON value: it is then re-driven
// compacted, its members in the order given. An edit that does not parse
// returns a *PayloadError (matching ErrInvalidPayload) with the parser's
// message and position; one that changes nothing returns an error
// matching idem.ErrInvalidArgument.
func EditedPayload(dl idem.DeadLetter, edited []byte) ([]byte, error) {
	out := edited
	if wantsJSON(dl.Message) {
		if err := checkJSON(edited); err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := json.Compact(&b, bytes.TrimSpace(edited)); err != nil {
			return nil, &PayloadError{Line: 1, Column: 1, Err: err}
		}
		out = b.Bytes()
		var orig bytes.Buffer
		if json.Compact(&orig, dl.Message.Payload) == nil && bytes.Equal(orig.Bytes(), out) {
			return nil, &idem.ArgumentError{Field: "payload", Reason: "is unchanged; re-drive the letter as it is instead"}
		}
	}
	if bytes.Equal(out, dl.Message.Payload) {
		return nil, &idem.ArgumentError{Field: "payload", Reason: "is unchanged; re-drive the letter as it is instead"}
	}
	return out, nil
}

// checkJSON returns a *PayloadError unless p is exactly one JSON value.
func checkJSON(p []byte) error {
	dec := json.NewDecoder(bytes.NewReader(p))
	var v any
	err := dec.Decode(&v)
	if err == nil {
		if _, terr := dec.Token(); terr == nil {
			err = errors.New("more than one JSON value")
		}
	}
	if err == nil {
		return nil
	}
	off := int(dec.InputOffset())
	var se *json.SyntaxError
	if errors.As(err, &se) {
		// Offset counts the offending byte; the column names it.
		off = int(se.Offset) - 1
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		off = len(p)
		if errors.Is(err, io.EOF) {
			err = errors.New("no JSON value")
		}
	}
	line, col := position(p, off)
	return &PayloadError{Line: line, Column: col, Err: err}
}

// position turns a byte offset into a line and a column, from 1.
func position(p []byte, off int) (line, col int) {
	off = max(0, min(off, len(p)))
	line = 1 + bytes.Count(p[:off], []byte("\n"))
	col = 1 + utf8.RuneCount(p[bytes.LastIndexByte(p[:off], '\n')+1:off])
	return line, col
}

// stamp is a time as pages show it.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// age is how long ago t was, roughly, for people.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// short cuts s to n characters, for tables.
func short(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// humanDuration is a duration as people say it: 1h, 30m, 1h30m.
func humanDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

var funcs = template.FuncMap{
	"duration": humanDuration,
	"stamp":    stamp,
	"age":      age,
	"short":    short,
	"pathEsc":  url.PathEscape,
	"visible":  func(s string) []span { return visible(s, "") },
	"parkedOf": func(m map[string]int, id string) int {
		return m[id]
	},
	"lastEvent": func(dl idem.DeadLetter) *idem.LetterEvent {
		if len(dl.History) == 0 {
			return nil
		}
		return &dl.History[len(dl.History)-1]
	},
}
