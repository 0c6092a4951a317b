package deadletter_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
)

// unsafeForTerminal reports the first rune of s that could act on a
// terminal or disguise what it shows: a control character other than a
// line break or a tab (C0, DEL, C1, among them ESC and CSI), or an
// invisible format character (bidirectional overrides and isolates,
// zero-width characters).
func unsafeForTerminal(s string) (rune, bool) {
	for _, r := range s {
		switch {
		case r == '\n' || r == '\t':
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r):
			return r, true
		}
	}
	return 0, false
}

// FuzzRender renders letters whose every field a hostile producer or a
// tampered database could choose, and checks that the output a person's
// terminal receives carries nothing that acts on the terminal, whatever
// the payload (JSON, text or bytes), headers, errors, actors and reasons.
func FuzzRender(f *testing.F) {
	for _, seed := range []struct{ payload, name, value, text string }{
		{`{"a":1}`, "Content-Type", "application/json", "plain"},
		{"{\"a\":\"\u009b31m red\"}", "X-\x1b[2J", "v\x1b]0;title\x07", "\u202egnp.exe"},
		{"text \u200b with \u2066isolate\u2069", "H", "\x9b", "bad \x1b[31mred"},
		{"\x00\x01binary\xff", "", "", "\r\n\x1b"},
		{"[\"\\u001b[31m\"]", "N\u202e", "\u061c", "\x7f"},
	} {
		f.Add([]byte(seed.payload), seed.name, seed.value, seed.text)
	}
	f.Fuzz(func(t *testing.T, payload []byte, name, value, text string) {
		dl := renderLetter(payload)
		dl.ID, dl.Consumer = text, text
		dl.Class, dl.State = idem.DeadLetterClass(text), idem.LetterState(text)
		dl.Message.ID, dl.Message.Topic, dl.Message.Key = text, text, text
		dl.Message.Headers = map[string]string{name: value, "X-" + text: text}
		dl.Attempts = append(dl.Attempts, idem.Attempt{Number: 3, Class: idem.ErrorClass(text), Error: text})
		dl.History = append(dl.History, idem.LetterEvent{Actor: text, Action: text, Reason: text, State: idem.LetterState(text)})
		var b strings.Builder
		if err := deadletter.Render(&b, dl); err != nil {
			t.Fatal(err)
		}
		if r, bad := unsafeForTerminal(b.String()); bad {
			t.Fatalf("the rendering carries %U, which a terminal would act on or hide:\n%q", r, b.String())
		}
		b.Reset()
		if err := deadletter.RenderList(&b, []idem.DeadLetter{dl, dl}); err != nil {
			t.Fatal(err)
		}
		if r, bad := unsafeForTerminal(b.String()); bad {
			t.Fatalf("the list carries %U, which a terminal would act on or hide:\n%q", r, b.String())
		}
	})
}
