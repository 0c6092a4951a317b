package main

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/keyed"
)

// A replica dies after the card network charged a payment, before the
// payment committed, and no completer runs. idem keys resume finishes it:
// one charge at the network, the payment recorded, its answer kept, and
// the client's retry gets it. Every refusal before (bad flags, an unknown
// key, the dead holder's lease not yet ended, a card network that does
// not answer) and --dry-run change nothing; the resume is kept in the
// key's history.
func TestKeysResume(t *testing.T) {
	t.Parallel()
	for name, dbArgs := range map[string]func(t *testing.T) []string{
		"sqlite": func(t *testing.T) []string {
			return []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
		},
		"postgres": func(t *testing.T) []string {
			u := postgresURL(t)
			return []string{"--db", u, "--pg-schema", freshSchema(t, u)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testKeysResume(t, dbArgs(t))
		})
	}
}

// openTestDB opens the database dbArgs (--db and, for PostgreSQL,
// --pg-schema) name, with the key store and the operators' history in it.
func openTestDB(t *testing.T, dbArgs []string) (idem.Recoverer, console.KeyHistory, func()) {
	t.Helper()
	schema := ""
	if len(dbArgs) == 4 {
		schema = dbArgs[3]
	}
	db, err := openDB(t.Context(), dbArgs[1], schema, true)
	if err != nil {
		t.Fatal(err)
	}
	store, h, err := settleStores(t.Context(), db)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	return store, h, func() { db.Close() }
}

// refuseHistory makes the database dbArgs name refuse, or accept again,
// new entries in the operators' history, as a history whose database
// fails does.
func refuseHistory(t *testing.T, dbArgs []string, refuse bool) {
	t.Helper()
	schema := ""
	if len(dbArgs) == 4 {
		schema = dbArgs[3]
	}
	db, err := openDB(t.Context(), dbArgs[1], schema, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.pg != nil {
		stmt := `DROP TRIGGER refuse_history ON key_actions`
		if refuse {
			stmt = `CREATE OR REPLACE FUNCTION refuse_history() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'the history refuses its entry'; END$$;
				CREATE TRIGGER refuse_history BEFORE INSERT ON key_actions FOR EACH ROW EXECUTE FUNCTION refuse_history()`
		}
		_, err = db.pg.Pool().Exec(t.Context(), stmt)
	} else {
		stmt := `DROP TRIGGER refuse_history`
		if refuse {
			stmt = `CREATE TRIGGER refuse_history BEFORE INSERT ON key_actions BEGIN SELECT RAISE(ABORT, 'the history refuses its entry'); END`
		}
		_, err = db.sqlite.Writer().ExecContext(t.Context(), stmt)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func testKeysResume(t *testing.T, dbArgs []string) {
	hs := startCardNetwork(t)
	a := startReplica(t, "a", append(append([]string{}, dbArgs...), "--acquirer", hs.URL, "--faults", "--log-level", "warn", "--key-lease", "2s"))
	acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("creating the account: %s", acct)
	}
	pay := map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR"}
	crash(t, a, "pay-1", pay)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the replica did not die after the charge")
	}

	state := func() idem.Record {
		t.Helper()
		s, _, done := openTestDB(t, dbArgs)
		defer done()
		rec, err := s.Get(t.Context(), "acme", "pay-1")
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	net, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	charges := func() int {
		t.Helper()
		chs, err := net.Charges(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		return len(chs)
	}
	if n := charges(); n != 1 {
		t.Fatalf("%d charges at the network after the crash; want 1", n)
	}
	resume := func(args ...string) (int, string, string) {
		return runCmd(t, append(append([]string{"keys", "resume", "--scope", "acme", "--operator", "alice"}, dbArgs...), args...)...)
	}
	withNet := []string{"--acquirer", hs.URL, "--acquirer-key", "net-key"}

	for _, bad := range [][]string{
		append([]string{"pay-1"}, withNet...), // no reason
		{"pay-1", "--reason", "r"},            // no --acquirer
		append([]string{"pay-1", "--reason", strings.Repeat("x", console.MaxReason+1)}, withNet...),
		append([]string{"bad key with spaces", "--reason", "r"}, withNet...),
		{"pay-1", "--reason", "r", "--acquirer", "ftp://nowhere"},
	} {
		if code, _, errOut := resume(bad...); code != exitUsage {
			t.Errorf("keys resume %q: exit %d, %q; want a usage error", bad, code, errOut)
		}
	}
	if code, _, errOut := resume(append([]string{"nope", "--reason", "r"}, withNet...)...); code != exitFailure || !strings.Contains(errOut, `no key "nope"`) || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("resuming an unknown key: exit %d, %q", code, errOut)
	}
	// The dead holder's lease has not ended yet, or has: either it is
	// refused as being finished, or the dry run says it can be resumed.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, errOut := resume(append([]string{"pay-1", "--reason", "r", "--dry-run"}, withNet...)...)
		if code == exitOK && strings.Contains(out, "dry run") {
			break
		}
		if code != exitFailure || !strings.Contains(errOut, "held by a live execution") || !strings.Contains(errOut, "nothing was changed") || time.Now().After(deadline) {
			t.Fatalf("keys resume --dry-run while the dead holder's lease runs: exit %d, %q, %q", code, out, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A card network that does not answer: refused, nothing changed.
	if code, _, errOut := resume("pay-1", "--reason", "r", "--acquirer", "http://127.0.0.1:1", "--acquirer-key", "net-key"); code != exitFailure || !strings.Contains(errOut, "does not answer") || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("resuming at a card network that does not answer: exit %d, %q", code, errOut)
	}
	if rec := state(); rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || rec.LeaseExpiresAt.After(time.Now()) {
		t.Fatalf("a refusal or a dry run changed pay-1: %v %q, lease until %v", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
	}

	// A history that refuses its entry: the resume is not taken, and the
	// key is as it was, in flight at its point, its lease ended; what it
	// did at the network (the dead execution's charge found) stands.
	refuseHistory(t, dbArgs, true)
	code, out, errOut := resume(append([]string{"pay-1", "--reason", "the completer is down"}, withNet...)...)
	if code != exitFailure || !strings.Contains(errOut, "could not be recorded") || !strings.Contains(errOut, "nothing was changed") {
		t.Fatalf("keys resume with a history that refuses its entry: exit %d, %q, %q", code, out, errOut)
	}
	if rec := state(); rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || rec.LeaseExpiresAt.After(time.Now()) {
		t.Fatalf("a resume whose history entry failed changed pay-1: %v %q, lease until %v; want it in flight at its point, its lease ended", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
	}
	if len(dbArgs) == 4 {
		// PostgreSQL: the store refuses the resume's own give-back (a
		// Yield) alone; the command gives the key back before it ends.
		refuseYield(t, dbArgs, true, 1)
		code, out, errOut = resume(append([]string{"pay-1", "--reason", "the completer is down"}, withNet...)...)
		if code != exitFailure || !strings.Contains(errOut, "could not be recorded") || !strings.Contains(errOut, "nothing was changed") || strings.Contains(errOut, "stays held") {
			t.Errorf("keys resume whose entry and first Yield failed: exit %d, %q, %q; want the key given back, nothing changed", code, out, errOut)
		}
		if rec := state(); rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || rec.LeaseExpiresAt.After(time.Now()) {
			t.Fatalf("pay-1 after a resume whose entry and first Yield failed: %v %q, lease until %v; want it given back, in flight at its point, its lease ended", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
		}
		refuseYield(t, dbArgs, false, 0)
	}
	// The store refuses every Yield: the key stays held under the lease
	// the command's resume took, and the command says until when.
	refuseYield(t, dbArgs, true, 1000)
	code, out, errOut = resume(append([]string{"pay-1", "--reason", "the completer is down"}, withNet...)...)
	rec := state()
	if rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" || !rec.LeaseExpiresAt.After(time.Now()) {
		t.Fatalf("pay-1 after a resume whose entry and Yield failed: %v %q, lease until %v; want it in flight at its point, held", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt)
	}
	if until := rec.LeaseExpiresAt.UTC().Format(time.RFC3339); code != exitFailure || !strings.Contains(errOut, "could not be recorded") || !strings.Contains(errOut, "stays held") || !strings.Contains(errOut, until) {
		t.Errorf("keys resume whose entry and give-back failed: exit %d, %q, %q; want a failure saying the key stays held until %s", code, out, errOut, until)
	}
	refuseYield(t, dbArgs, false, 0)
	// That lease ends by itself, nobody renewing it.
	s, _, done := openTestDB(t, dbArgs)
	idemtest.Eventually(t, 30*time.Second, "the end of the lease of the resume whose give-back failed", func() bool {
		rec, err := s.Get(t.Context(), "acme", "pay-1")
		if err != nil {
			t.Fatal(err)
		}
		return !rec.LeaseExpiresAt.After(time.Now())
	})
	done()
	refuseHistory(t, dbArgs, false)

	code, out, errOut = resume(append([]string{"pay-1", "--reason", "the completer is down"}, withNet...)...)
	if code != exitOK || !strings.Contains(out, "resumed") || !strings.Contains(out, "gets 201") {
		t.Fatalf("keys resume: exit %d, %q, %q", code, out, errOut)
	}
	if rec := state(); rec.State != idem.StateCompleted || rec.Response == nil || rec.Response.Status != http.StatusCreated {
		t.Fatalf("pay-1 after the resume: %v %+v", rec.State, rec.Response)
	}
	if n := charges(); n != 1 {
		t.Fatalf("%d charges at the network after the resume; want the one the dead execution made", n)
	}
	if code, _, errOut := resume(append([]string{"pay-1", "--reason", "again"}, withNet...)...); code != exitFailure || !strings.Contains(errOut, "completed") || !strings.Contains(errOut, "nothing was changed") {
		t.Errorf("resuming a finished key: exit %d, %q", code, errOut)
	}

	_, h, done := openTestDB(t, dbArgs)
	evs, err := h.KeyEvents(t.Context(), "acme", "pay-1", console.KeyEventsQuery{})
	done()
	if err != nil || len(evs) != 1 || evs[0].Actor != "alice" || evs[0].Action != console.ActionResume || evs[0].Reason != "the completer is down" || evs[0].Result != "finished" {
		t.Fatalf("pay-1's history: %+v %v; want alice's resume with its reason", evs, err)
	}

	// The client's retry, on the service started again, gets the answer
	// the resume kept: the payment with its charge.
	a.start(t)
	defer a.stop(t)
	r := a.post(t, "/v1/payments", "pay-1", "", pay)
	if r.status != http.StatusCreated || r.body["charge_id"] == nil || r.body["charge_id"] == "" {
		t.Fatalf("the client's retry: %s; want 201 with the charge", r)
	}
	if n := charges(); n != 1 {
		t.Fatalf("%d charges at the network after the retry; want 1", n)
	}
}

// yieldFails is an in-memory store whose Yield fails, as one that went
// away does.
type yieldFails struct{ *idemmem.Store }

func (yieldFails) Yield(context.Context, idem.Ref) error { return errors.New("the store went away") }

// getFails is an in-memory store whose Get fails.
type getFails struct{ *idemmem.Store }

func (getFails) Get(context.Context, idem.Scope, idem.Key) (idem.Record, error) {
	return idem.Record{}, errors.New("the store went away")
}

// A give-back that fails, with the key's record unreadable, says when the
// lease the command's completer took ends at the latest: by now plus that
// completer's lease, whatever keyed's default is.
func TestGiveBackNamesTheLeaseItTook(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	clock := idemmem.NewClock(time.Now())
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	eng, err := keyed.New(&keyed.Config{Store: yieldFails{mem}, SeparateTx: true, Clock: clock, Timers: clock, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		return idem.Response{}, errors.New("the card network did not answer")
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := mem.Claim(t.Context(), idem.ClaimRequest{Scope: "acme", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.SaveRecovery(t.Context(), idem.Ref{Scope: "acme", Key: "k", Token: c.Token}, idem.RecoveryPoint{Name: "charging"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second) // the holder's lease ended
	if _, err := comp.ResumeKey(t.Context(), "acme", "k", false); err == nil {
		t.Fatal("ResumeKey = nil; want the resume's error")
	}
	if f := comp.Failures("acme", "k"); !f.Holding {
		t.Fatalf("after a failed resume whose store refuses Yield: %+v; want the completer holding the key", f)
	}
	before := time.Now()
	err = giveBack(t.Context(), keyed.Completers{comp}, getFails{mem}, "acme", "k")
	after := time.Now()
	if err == nil {
		t.Fatal("giveBack with the store refusing Yield = nil; want the key held")
	}
	ok := false
	for at := before.Add(lease).Truncate(time.Second); !at.After(after.Add(lease)); at = at.Add(time.Second) {
		ok = ok || strings.Contains(err.Error(), "by "+at.UTC().Format(time.RFC3339)+" at the latest")
	}
	if !ok {
		t.Errorf("giveBack = %v; want the key held by %s at the latest, the completer's lease (%v) from now", err, before.Add(lease).UTC().Format(time.RFC3339), lease)
	}
}
