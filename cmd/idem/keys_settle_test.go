package main

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// keys settle ends an execution stopped at a recovery point with the
// answer the client's retry gets, keeping who, when, what and why in the
// key's history; --dry-run and every refusal (bad flags, an unknown key, a
// key without a point, a key already settled) change nothing.
func TestKeysSettle(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "idem.db")
	dbURL := "sqlite:" + file
	db, err := idemsqlite.Open(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	// An hour ago by the store's clock: the leases have long ended by the
	// command's.
	clock := idemmem.NewClock(time.Now().Add(-time.Hour))
	store, err := idemsqlite.NewStore(t.Context(), db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []idem.Key{"pay-1", "pay-2", "no-point"} {
		c, err := store.Claim(t.Context(), idem.ClaimRequest{Scope: "acme", Key: key, Fingerprint: "fp", Lease: time.Second, TTL: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if key == "no-point" {
			continue
		}
		if err := store.SaveRecovery(t.Context(), idem.Ref{Scope: "acme", Key: key, Token: c.Token}, idem.RecoveryPoint{Name: "charging", Data: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	state := func(key idem.Key) idem.Record {
		t.Helper()
		db, err := idemsqlite.Open(file, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		s, err := idemsqlite.NewStore(t.Context(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(t.Context(), "acme", key)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	settle := func(args ...string) (int, string, string) {
		return runCmd(t, append([]string{"keys", "settle", "--db", dbURL, "--scope", "acme", "--operator", "alice"}, args...)...)
	}

	for _, bad := range [][]string{
		{"pay-1", "--failed"},                                     // no reason
		{"pay-1", "--reason", "r"},                                // neither --failed nor --status
		{"pay-1", "--reason", "r", "--failed", "--status", "200"}, // both
		{"pay-1", "--reason", "r", "--status", "201", "--body", `{"a":`},
		{"pay-1", "--reason", "r", "--status", "42", "--body", `{}`},
		{"pay-1", "--reason", "r", "--status", "200", "--body", "ok", "--content-type", "text/plain\x1b[2J"},
		{"bad key with spaces", "--reason", "r", "--failed"},
	} {
		if code, _, errOut := settle(bad...); code != exitUsage {
			t.Errorf("keys settle %q: exit %d, %q; want a usage error", bad, code, errOut)
		}
	}
	if code, _, errOut := settle("nope", "--reason", "r", "--failed"); code != exitFailure || !strings.Contains(errOut, `no key "nope"`) || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("settling an unknown key: exit %d, %q", code, errOut)
	}
	if code, _, errOut := settle("no-point", "--reason", "r", "--failed"); code != exitFailure || !strings.Contains(errOut, "without a recovery point") {
		t.Errorf("settling a key without a point: exit %d, %q", code, errOut)
	}
	if code, out, errOut := settle("pay-1", "--reason", "checked", "--failed", "--dry-run"); code != exitOK || !strings.Contains(out, "dry run") {
		t.Fatalf("--dry-run: exit %d, %q, %q", code, out, errOut)
	}
	for _, key := range []idem.Key{"pay-1", "pay-2", "no-point"} {
		if rec := state(key); rec.State != idem.StateInFlight {
			t.Fatalf("a refusal or a dry run changed %s: %v", key, rec.State)
		}
	}

	if code, out, errOut := settle("pay-1", "--reason", "no charge at the network", "--failed"); code != exitOK || !strings.Contains(out, "gets 409") {
		t.Fatalf("keys settle --failed: exit %d, %q, %q", code, out, errOut)
	}
	if rec := state("pay-1"); rec.State != idem.StateCompleted || rec.Response.Status != http.StatusConflict || rec.Response.Header.Get(console.SettledHeader) != "failed" {
		t.Fatalf("pay-1 after the settle: %v %+v", rec.State, rec.Response)
	}
	if code, out, errOut := settle("pay-2", "--reason", "the network says charged", "--status", "201", "--body", `{"status":"succeeded"}`); code != exitOK || !strings.Contains(out, "gets 201") {
		t.Fatalf("keys settle --status: exit %d, %q, %q", code, out, errOut)
	}
	if rec := state("pay-2"); rec.Response == nil || rec.Response.Status != http.StatusCreated || string(rec.Response.Body) != `{"status":"succeeded"}` || rec.Response.Header.Get(console.SettledHeader) != "answer" {
		t.Fatalf("pay-2 after the settle: %+v", rec.Response)
	}
	if code, _, errOut := settle("pay-1", "--reason", "again", "--failed"); code != exitFailure || !strings.Contains(errOut, "completed") {
		t.Errorf("settling a settled key: exit %d, %q", code, errOut)
	}

	db, err = idemsqlite.Open(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h, err := payments.KeyHistory(db)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := h.KeyEvents(t.Context(), "acme", "pay-1", console.KeyEventsQuery{})
	if err != nil || len(evs) != 1 || evs[0].Actor != "alice" || evs[0].Action != console.ActionSettleFailed || evs[0].Reason != "no charge at the network" || evs[0].At.IsZero() {
		t.Fatalf("pay-1's history: %+v %v; want alice's settle with its reason", evs, err)
	}
}

// keys resume and keys settle name keys in their logs (their completer's
// resume and settle) under $IDEM_KEY_DIGEST_SECRET as serve and the
// console do, so that their lines and the replicas' name a key alike; a
// secret too short is refused as a usage error before anything is opened.
func TestKeysResumeAndSettleTakeTheKeyDigestSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"resume", []string{"keys", "resume", "--scope", "acme", "pay-1", "--reason", "r", "--operator", "alice", "--acquirer", "http://127.0.0.1:1"}},
		{"settle", []string{"keys", "settle", "--scope", "acme", "pay-1", "--reason", "r", "--operator", "alice", "--failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := filepath.Join(t.TempDir(), "idem.db")
			code, _, errOut := runWithEnv(t, map[string]string{envKeyDigestSecret: "short-secret"},
				append(tc.args, "--db", "sqlite:"+db)...)
			if want := "$" + envKeyDigestSecret + ": 12 bytes long; at least 16 are needed"; code != exitUsage || !strings.Contains(errOut, want) {
				t.Errorf("keys %s with a short $%s: exit %d, stderr %q; want a usage error saying %q", tc.name, envKeyDigestSecret, code, errOut, want)
			}
			if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused keys %s created the database: %v", tc.name, err)
			}
		})
	}
}
