package deadletter_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
)

func renderLetter(payload []byte) idem.DeadLetter {
	return idem.DeadLetter{
		ID: "dl-7", Consumer: "settlement", Class: idem.DeadExhausted, State: idem.LetterRedriven,
		Message: idem.Message{
			ID: "evt-1", Topic: "payments.succeeded", Key: "acct-1",
			Headers: map[string]string{"Idem-Fault": "fail-times=100", "Content-Type": "application/json"},
			Payload: payload, Time: t0,
		},
		Attempts: []idem.Attempt{
			{Number: 1, At: t0.Add(time.Second), Class: idem.ClassTransient, Error: "injected fault"},
			{Number: 2, At: t0.Add(1500 * time.Millisecond), Class: idem.ClassTransient, Error: "injected fault\nsecond line"},
		},
		FirstFailedAt: t0.Add(time.Second), LastFailedAt: t0.Add(1500 * time.Millisecond),
		History: []idem.LetterEvent{
			{At: t0.Add(2 * time.Second), Actor: "settlement", Action: "dead-lettered", Reason: "injected fault", State: idem.LetterDead},
			{At: t0.Add(time.Hour), Actor: "alice", Action: "redriven", Reason: "fault removed", State: idem.LetterRedriven},
		},
	}
}

func TestRenderJSON(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	if err := deadletter.Render(&b, renderLetter([]byte(`{"event_id":"evt-1","amount":1250,"tags":["a"]}`))); err != nil {
		t.Fatal(err)
	}
	want := `Dead letter   dl-7
State         redriven
Consumer      settlement
Class         exhausted
Message ID    evt-1
Topic         payments.succeeded
Key           acct-1
Published     2026-03-04 05:06:07.000Z
First failed  2026-03-04 05:06:08.000Z
Last failed   2026-03-04 05:06:08.500Z
Attempts      2
Last error    injected fault ⏎ second line

Payload (JSON, 47 bytes)
  {
    "event_id": "evt-1",
    "amount": 1250,
    "tags": [
      "a"
    ]
  }

Headers
  Content-Type:  application/json
  Idem-Fault:    fail-times=100

Attempts
  2026-03-04 05:06:08.000Z          #1  transient  injected fault
  2026-03-04 05:06:08.500Z  +500ms  #2  transient  injected fault ⏎ second line

History
  2026-03-04 05:06:09.000Z  dead-lettered  by settlement  -> dead      reason: injected fault
  2026-03-04 06:06:07.000Z  redriven       by alice       -> redriven  reason: fault removed
`
	if got := b.String(); got != want {
		t.Fatalf("Render:\n%s\nwant:\n%s", got, want)
	}
}

func TestRenderPayloads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		payload []byte
		want    []string
	}{
		{"text", []byte("amount=12.50\ncurrency=EUR"), []string{"Payload (text, 25 bytes)\n  amount=12.50\n  currency=EUR\n"}},
		{"binary", []byte{0x00, 0x01, 0xff, 'A'}, []string{"Payload (binary, hex dump, 4 bytes)\n  00000000  00 01 ff 41", "|...A|"}},
		{"invalid UTF-8", []byte("caf\xe9"), []string{"(binary, hex dump, 4 bytes)", "63 61 66 e9"}},
		{"empty", nil, []string{"Payload (empty, 0 bytes)\n  (empty)\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			if err := deadletter.Render(&b, renderLetter(tc.payload)); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestRenderSparseLetter(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	dl := idem.DeadLetter{ID: "dl-1", Consumer: "c", Class: idem.DeadPermanent, State: idem.LetterDead,
		Message: idem.Message{ID: "m", Topic: "t"}}
	if err := deadletter.Render(&b, dl); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"Key           (none)", "Published     (unknown)", "Headers\n  (none)", "Attempts\n  (none recorded)", "History\n  (none)"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, b.String())
		}
	}
}

type failingWriter struct{}

var errWrite = errors.New("disk full")

func (failingWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestRenderReturnsWriteError(t *testing.T) {
	t.Parallel()
	if err := deadletter.Render(failingWriter{}, renderLetter(nil)); !errors.Is(err, errWrite) {
		t.Fatalf("Render: got %v, want the writer's error", err)
	}
}

func TestRenderEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	dl := renderLetter(nil)
	dl.Attempts[1].Error = "bad \x1b[31mred\x1b[0m"
	var b strings.Builder
	if err := deadletter.Render(&b, dl); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "\x1b") || !strings.Contains(b.String(), `bad \x1b[31mred\x1b[0m`) {
		t.Fatalf("control characters not escaped:\n%q", b.String())
	}
}

// A JSON payload's invisible characters are shown as JSON escapes: one
// \u escape for a character of the Basic Multilingual Plane, a surrogate
// pair for one beyond it.
func TestRenderEscapesInvisibleCharactersInJSON(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	if err := deadletter.Render(&b, renderLetter([]byte("{\"name\":\"a\u202eb\",\"tag\":\"c\U000E0001d\"}"))); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{`"name": "a\u202eb"`, `"tag": "c\udb40\udc01d"`} {
		if !strings.Contains(out, want) {
			t.Errorf("rendering lacks %s:\n%s", want, out)
		}
	}
}
