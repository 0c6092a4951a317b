package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemsqlite"
)

func TestDLQFilter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		flags filterFlags
		want  idem.DeadLetterFilter
		usage bool
	}{
		{"none", filterFlags{}, idem.DeadLetterFilter{}, false},
		{"consumer and class", filterFlags{consumer: "settlement", class: "exhausted"},
			idem.DeadLetterFilter{Consumer: "settlement", Class: idem.DeadExhausted}, false},
		{"since a duration", filterFlags{since: "90m"}, idem.DeadLetterFilter{Since: now.Add(-90 * time.Minute)}, false},
		{"since a time", filterFlags{since: "2026-04-30T00:00:00Z"}, idem.DeadLetterFilter{Since: time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)}, false},
		{"unknown class", filterFlags{class: "transient"}, idem.DeadLetterFilter{}, true},
		{"bad since", filterFlags{since: "yesterday"}, idem.DeadLetterFilter{}, true},
	}
	for _, tt := range tests {
		got, err := tt.flags.filter(now)
		var ue *usageError
		if errors.As(err, &ue) != tt.usage || (err != nil) != tt.usage {
			t.Errorf("%s: error %v, want a usage error: %v", tt.name, err, tt.usage)
			continue
		}
		if !tt.usage && (got.Consumer != tt.want.Consumer || got.Class != tt.want.Class || !got.Since.Equal(tt.want.Since)) {
			t.Errorf("%s: filter = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestDefaultActor(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	found := func(name string) func() (*user.User, error) {
		return func() (*user.User, error) { return &user.User{Username: name}, nil }
	}
	unknown := func() (*user.User, error) { return nil, errors.New("no such user") }
	tests := []struct {
		name    string
		current func() (*user.User, error)
		env     map[string]string
		want    string
	}{
		{"the OS user", found("carol"), map[string]string{"USER": "mallory"}, "carol"},
		{"$USER when the OS does not know", unknown, map[string]string{"USER": " dave "}, "dave"},
		{"blank OS user", found("  "), map[string]string{"USER": "erin"}, "erin"},
		{"neither", unknown, nil, "cli"},
	}
	for _, tt := range tests {
		if got := defaultActor(tt.current, env(tt.env)); got != tt.want {
			t.Errorf("%s: defaultActor = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// dlqWorld is a migrated payment database on SQLite with one dead letter
// whose key holds two messages parked behind it.
func dlqWorld(t *testing.T) (dbFlag, id string, svc *deadletter.Service) {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if svc, err = payments.DeadLetterService(ctx, db); err != nil {
		t.Fatal(err)
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	id, err = letters.Add(ctx, idem.DeadLetter{
		Consumer: payments.SettlementConsumer, Class: idem.DeadPermanent,
		Message:       idem.Message{ID: "evt-1", Topic: payments.TopicPaymentSucceeded, Key: "acct\x1b[2J-1", Payload: []byte(`{"event_id":"evt-1","amount":999}`)},
		Attempts:      []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: "event disagrees"}},
		FirstFailedAt: at, LastFailedAt: at,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.HoldBack(ctx, payments.SettlementConsumer, "acct\x1b[2J-1", id); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"evt-2", "evt-3"} {
		if err := ledger.Park(ctx, payments.SettlementConsumer, idem.Message{ID: m, Topic: payments.TopicPaymentSucceeded, Key: "acct\x1b[2J-1", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	return "sqlite:" + path, id, svc
}

func TestDLQLsShowsParked(t *testing.T) {
	t.Parallel()
	db, id, _ := dlqWorld(t)
	code, out, errOut := runCmd(t, "dlq", "ls", "--db", db)
	if code != exitOK || !strings.Contains(out, `key "acct\x1b[2J-1" ("settlement"): 2 parked behind `+id) || strings.Contains(out, "\x1b") {
		t.Errorf("dlq ls: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runCmd(t, "dlq", "ls", "--json", "--db", db)
	var letters []letterJSON
	if err := json.Unmarshal([]byte(out), &letters); code != exitOK || err != nil || len(letters) != 1 || letters[0].Parked != 2 {
		t.Errorf("dlq ls --json: exit %d, %v, %+v", code, err, letters)
	}
}

func TestDLQEdit(t *testing.T) {
	t.Parallel()
	db, id, svc := dlqWorld(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(env map[string]string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		a := newApp(env)
		a.stdout, a.stderr = &out, &errOut
		code := a.run(t.Context(), append([]string{"dlq", "edit", "--db", db}, args...))
		return code, out.String(), errOut.String()
	}
	state := func() idem.DeadLetter {
		dl, err := svc.Show(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return dl
	}

	// Refused, changing nothing: invalid JSON, no payload source, unchanged.
	code, _, errOut := run(nil, id, "--payload-file", write("bad.json", "{\"event_id\": \"evt-1\",\n \"amount\": 12x}"))
	if code != exitFailure || !strings.Contains(errOut, "invalid character 'x'") || !strings.Contains(errOut, "line 2, column 14") {
		t.Errorf("invalid JSON: exit %d, %q", code, errOut)
	}
	if code, _, errOut := run(nil, id); code != exitUsage || !strings.Contains(errOut, "--payload-file") {
		t.Errorf("no payload and no $EDITOR: exit %d, %q", code, errOut)
	}
	if code, _, errOut := run(nil, id, "--payload-file", write("same.json", `{ "event_id": "evt-1", "amount": 999 }`)); code != exitFailure || !strings.Contains(errOut, "unchanged") {
		t.Errorf("unchanged: exit %d, %q", code, errOut)
	}
	if code, _, errOut := run(nil, "dl_nope", "--payload-file", write("ok.json", `{}`)); code != exitFailure || !strings.Contains(errOut, "not found") {
		t.Errorf("unknown letter: exit %d, %q", code, errOut)
	}
	if dl := state(); dl.State != idem.LetterDead || len(dl.History) != 1 {
		t.Fatalf("after refused edits: %s, %d events", dl.State, len(dl.History))
	}

	// With $EDITOR: the editor gets the payload indented; a dry run
	// changes nothing.
	editor := write("editor.sh", "#!/bin/sh\ngrep -q '  \"amount\": 999' \"$1\" || exit 3\nsed -i 's/999/1200/' \"$1\"\n")
	if err := os.Chmod(editor, 0o700); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(map[string]string{"EDITOR": editor}, id, "--dry-run", "--actor", "carol")
	if code != exitOK || !strings.Contains(out, id+": would be edited and redriven, releasing 2 parked message(s)") {
		t.Fatalf("dry run: exit %d, %q, %q", code, out, errOut)
	}
	if dl := state(); dl.State != idem.LetterDead {
		t.Fatalf("the dry run changed the letter: %s", dl.State)
	}
	code, out, errOut = run(map[string]string{"EDITOR": editor}, id, "--actor", "carol", "--reason", "amount from the ledger")
	if code != exitOK || !strings.Contains(out, id+": edited and redriven, releasing 2 parked message(s)") {
		t.Fatalf("edit: exit %d, %q, %q", code, out, errOut)
	}
	dl := state()
	ev := dl.History[len(dl.History)-1]
	if dl.State != idem.LetterRedriven || ev.Actor != "carol" || ev.Action != "edited and redriven" || ev.Reason != "amount from the ledger" {
		t.Errorf("after the edit: %s, %+v", dl.State, ev)
	}
	// A second edit is refused.
	if code, _, errOut := run(nil, id, "--payload-file", write("again.json", `{"event_id":"evt-1","amount":1}`)); code != exitFailure || !strings.Contains(errOut, "not dead") {
		t.Errorf("second edit: exit %d, %q", code, errOut)
	}
}
