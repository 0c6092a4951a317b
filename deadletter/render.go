package deadletter

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// timeFormat is precise to the millisecond, which separates attempts, and
// readable.
const timeFormat = "2006-01-02 15:04:05.000Z07:00"

// Render writes dl for a person to read, as `idem dlq show` prints it: the
// letter's fields, the payload pretty-printed (JSON indented; other text
// as it is, when it is printable UTF-8; anything else as a hex dump), the
// headers, the attempts as a timeline and the history. Times are in UTC.
// Returns w's error.
func Render(w io.Writer, dl idem.DeadLetter) error {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, oneLine(value)) }
	field("Dead letter", dl.ID)
	field("State", string(dl.State))
	field("Consumer", dl.Consumer)
	field("Class", string(dl.Class))
	field("Message ID", dl.Message.ID)
	field("Topic", dl.Message.Topic)
	field("Key", orNone(dl.Message.Key))
	field("Published", stamp(dl.Message.Time))
	field("First failed", stamp(dl.FirstFailedAt))
	field("Last failed", stamp(dl.LastFailedAt))
	field("Attempts", fmt.Sprint(len(dl.Attempts)))
	field("Last error", orNone(dl.LastError()))
	_ = tw.Flush()

	kind, body := payload(dl.Message.Payload)
	fmt.Fprintf(&b, "\nPayload (%s, %d bytes)\n", kind, len(dl.Message.Payload))
	b.WriteString(indent(body))

	b.WriteString("\nHeaders\n")
	if len(dl.Message.Headers) == 0 {
		b.WriteString("  (none)\n")
	} else {
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		names := make([]string, 0, len(dl.Message.Headers))
		for name := range dl.Message.Headers {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			fmt.Fprintf(tw, "  %s:\t%s\n", oneLine(name), oneLine(dl.Message.Headers[name]))
		}
		_ = tw.Flush()
	}

	b.WriteString("\nAttempts\n")
	if len(dl.Attempts) == 0 {
		b.WriteString("  (none recorded)\n")
	} else {
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		var prev time.Time
		for i, a := range dl.Attempts {
			gap := ""
			if i > 0 && !prev.IsZero() && !a.At.IsZero() {
				gap = "+" + a.At.Sub(prev).Round(time.Millisecond).String()
			}
			prev = a.At
			fmt.Fprintf(tw, "  %s\t%s\t#%d\t%s\t%s\n", stamp(a.At), gap, a.Number, oneLine(string(a.Class)), oneLine(a.Error))
		}
		_ = tw.Flush()
	}

	b.WriteString("\nHistory\n")
	if len(dl.History) == 0 {
		b.WriteString("  (none)\n")
	} else {
		tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for _, ev := range dl.History {
			reason := ""
			if ev.Reason != "" {
				reason = "reason: " + oneLine(ev.Reason)
			}
			fmt.Fprintf(tw, "  %s\t%s\tby %s\t-> %s\t%s\n", stamp(ev.At), oneLine(ev.Action), oneLine(orNone(ev.Actor)), oneLine(string(ev.State)), reason)
		}
		_ = tw.Flush()
	}
	_, err := w.Write(trimLineEnds(b.Bytes()))
	return err
}

// RenderList writes dls as a table for a person to read, one letter a
// row, as `idem dlq ls` prints it: ID, consumer, class, state, attempts,
// when it last failed, the message ID and the last error cut to 60
// characters. Every field is shown as Render shows it: on one line, with
// whatever could act on a terminal escaped. Returns w's error.
func RenderList(w io.Writer, dls []idem.DeadLetter) error {
	if len(dls) == 0 {
		_, err := io.WriteString(w, "no dead letters\n")
		return err
	}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCONSUMER\tCLASS\tSTATE\tATTEMPTS\tLAST FAILED\tMESSAGE\tLAST ERROR")
	for _, dl := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", oneLine(dl.ID), oneLine(dl.Consumer), oneLine(string(dl.Class)),
			oneLine(string(dl.State)), len(dl.Attempts), stamp(dl.LastFailedAt), oneLine(dl.Message.ID), shorten(oneLine(dl.LastError()), 60))
	}
	_ = tw.Flush()
	_, err := w.Write(trimLineEnds(b.Bytes()))
	return err
}

// shorten cuts s to n characters, the last one an ellipsis.
func shorten(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// payload returns how p is shown and the text that shows it.
func payload(p []byte) (kind, body string) {
	switch {
	case len(p) == 0:
		return "empty", "(empty)\n"
	case json.Valid(p):
		var out bytes.Buffer
		if err := json.Indent(&out, p, "", "  "); err == nil {
			out.WriteByte('\n')
			return "JSON", escapeInvisible(out.String())
		}
	case printable(p):
		s := strings.ReplaceAll(string(p), "\r\n", "\n")
		if !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		return "text", s
	}
	return "binary, hex dump", hex.Dump(p)
}

// printable reports whether p is UTF-8 text a terminal shows as it is:
// no control or format characters but line breaks (LF, or CR LF) and
// tabs. A lone CR, which would let the text overwrite what is shown
// before it, makes it binary.
func printable(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	s := string(p)
	for i, r := range s {
		switch {
		case r == '\n' || r == '\t':
		case r == '\r':
			if !strings.HasPrefix(s[i:], "\r\n") {
				return false
			}
		case unsafeRune(r), !unicode.IsPrint(r) && !unicode.IsSpace(r):
			return false
		}
	}
	return true
}

func indent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l == "" {
			continue
		}
		b.WriteString("  ")
		b.WriteString(l)
	}
	return b.String()
}

// oneLine keeps a value on its table row, and shows the control
// characters of a hostile or broken message as escapes rather than let
// them act on the terminal, and its invisible format characters (such as
// a right-to-left override that makes "exe.gnp" read "png.exe") as escapes
// rather than let them disguise what is shown.
func oneLine(s string) string {
	s = strings.NewReplacer("\r\n", " ⏎ ", "\n", " ⏎ ", "\r", " ⏎ ").Replace(s)
	if !strings.ContainsFunc(s, unsafeRune) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case !unsafeRune(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// unsafeRune reports whether r would act on a terminal or hide itself: a
// control character (C0, DEL, C1; line breaks included, which callers
// handle first) or a format character (bidirectional controls,
// zero-width characters).
func unsafeRune(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// escapeInvisible writes, in indented JSON, the characters that JSON lets
// a string hold raw but a terminal would act on or hide (C1 controls,
// format characters) as \u escapes, which read back as the same JSON.
// Line breaks and tabs outside strings are the indentation's own.
func escapeInvisible(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && r != '\t' && unsafeRune(r) }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == '\n' || r == '\t' || !unsafeRune(r) {
			b.WriteRune(r)
			continue
		}
		if r > 0xffff {
			// Outside the Basic Multilingual Plane: a surrogate pair.
			r -= 0x10000
			fmt.Fprintf(&b, "\\u%04x\\u%04x", 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			continue
		}
		fmt.Fprintf(&b, "\\u%04x", r)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "(unknown)"
	}
	return t.UTC().Format(timeFormat)
}

// trimLineEnds drops the spaces tabwriter leaves at the ends of lines.
func trimLineEnds(p []byte) []byte {
	lines := bytes.Split(p, []byte("\n"))
	for i, l := range lines {
		lines[i] = bytes.TrimRight(l, " ")
	}
	return bytes.Join(lines, []byte("\n"))
}
