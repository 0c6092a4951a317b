package consoletest_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// An operator acts on an unknown outcome from the console: each action is
// confirmed on a page of its own and needs a reason, and is refused
// without them, changing nothing; a resume that fails is counted on the
// page with its error; a settle as failed ends the key with the answer the
// client's retry gets, drops the unknown count, and shows in the key's
// history with who, when, what and why (a reason holding a script shows
// as text). A second settle, an unknown key, a malformed key or answer,
// and a cross-site POST are refused, changing nothing.
func TestUnknownOutcomeActions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	kdb, err := idemsqlite.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kdb.Close() })
	store, err := idemsqlite.NewStore(ctx, kdb, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, SeparateTx: true, SharedScope: true, Lease: 10 * time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := mw.NewCompleter(&idemhttp.CompleterConfig{Every: time.Hour,
		Resume: func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
			return errors.New("card network unavailable")
		}})
	if err != nil {
		t.Fatal(err)
	}
	show := func(_ context.Context, rec idem.Record) ([]console.PointField, error) {
		return []console.PointField{{Name: "payment", Value: string(rec.Recovery.Data)}}, nil
	}
	w := newWorld(t, &console.Config{Clock: clock, Recoveries: store, ShowPoint: show, Actions: comp})

	c, err := store.Claim(ctx, idem.ClaimRequest{Scope: "acme", Key: "pay-1", Fingerprint: "fp", Lease: time.Second, TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SaveRecovery(ctx, idem.Ref{Scope: "acme", Key: "pay-1", Token: c.Token}, idem.RecoveryPoint{Name: "charging", Data: []byte(`<script>alert(1)</script>`)}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)

	get := func(path string, want int) string {
		t.Helper()
		rec := w.do(req{path: path, token: aliceToken})
		if rec.Code != want {
			t.Fatalf("GET %s: %d, want %d\n%s", path, rec.Code, want, rec.Body)
		}
		return rec.Body.String()
	}
	post := func(form url.Values, want int) string {
		t.Helper()
		rec := w.act(form)
		if rec.Code != want {
			t.Fatalf("POST %v: %d, want %d\n%s", form, rec.Code, want, rec.Body)
		}
		return rec.Body.String()
	}
	inFlight := func() {
		t.Helper()
		if rec, err := store.Get(ctx, "acme", "pay-1"); err != nil || rec.State != idem.StateInFlight {
			t.Fatalf("the key changed: %v %v", rec.State, err)
		}
	}
	keyPage := "/console/outcomes/key?key=pay-1&scope=acme"
	if body := get("/console/outcomes", http.StatusOK); !strings.Contains(body, `href="/console/outcomes/key?key=pay-1&amp;scope=acme"`) {
		t.Fatalf("the list does not link the key's page:\n%s", body)
	}
	body := get(keyPage, http.StatusOK)
	for _, want := range []string{`id="act-resume"`, `id="act-settle-failed"`, `id="act-settle-answer"`, "&lt;script&gt;alert(1)&lt;/script&gt;", "No operator has acted"} {
		if !strings.Contains(body, want) {
			t.Fatalf("the key's page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<script>") {
		t.Fatalf("the point's data is not shown as text:\n%s", body)
	}

	// Resume now: a confirmation page first; without the confirmation or
	// a reason, refused.
	if body := get("/console/outcomes/act?action=resume&key=pay-1&scope=acme", http.StatusOK); !strings.Contains(body, `name="reason"`) || !strings.Contains(body, `name="confirm"`) {
		t.Fatalf("the confirmation page:\n%s", body)
	}
	resume := url.Values{"scope": {"acme"}, "key": {"pay-1"}, "action": {"resume"}, "reason": {"card network back?"}}
	if body := post(resume, http.StatusBadRequest); !strings.Contains(body, "Confirm the action") {
		t.Fatalf("without the confirmation:\n%s", body)
	}
	resume.Set("confirm", "yes")
	resume.Set("reason", "  ")
	if body := post(resume, http.StatusBadRequest); !strings.Contains(body, "A reason is required") {
		t.Fatalf("without a reason:\n%s", body)
	}
	if s := comp.Stats(); s.Failed != 0 {
		t.Fatalf("a refused resume ran: %+v", s)
	}
	resume.Set("reason", "card network back?")
	rr := w.act(resume)
	if rr.Code != http.StatusSeeOther || !strings.HasSuffix(rr.Header().Get("Location"), "&done=resume-failed") {
		t.Fatalf("the resume: %d %q", rr.Code, rr.Header().Get("Location"))
	}
	inFlight()
	body = get(rr.Header().Get("Location"), http.StatusOK)
	for _, want := range []string{"The resume failed", "1, the last at", "card network unavailable", "card network back?", "failed: card network unavailable"} {
		if !strings.Contains(body, want) {
			t.Fatalf("after a failed resume the key's page lacks %q:\n%s", want, body)
		}
	}
	if body := get("/console/outcomes", http.StatusOK); !strings.Contains(body, "1: <span class=\"problem\">card network unavailable</span>") || !strings.Contains(body, ">unknown</strong>") {
		t.Fatalf("the list does not show the failed resume:\n%s", body)
	}
	if ov := get("/console/", http.StatusOK); !strings.Contains(ov, "1 unknown outcome(s)") {
		t.Fatalf("overview after a failed resume:\n%s", ov)
	}
	if s := comp.Stats(); s.Unknown != 1 {
		t.Fatalf("unknown after the failed resume: %d", s.Unknown)
	}

	// A malformed answer is refused, nothing changed.
	answer := url.Values{"scope": {"acme"}, "key": {"pay-1"}, "action": {"settle-answer"}, "reason": {"r"}, "confirm": {"yes"},
		"status": {"201"}, "body": {`{"status": "succeeded"`}}
	if body := post(answer, http.StatusBadRequest); !strings.Contains(body, "not one JSON value") || !strings.Contains(body, "Nothing was changed") {
		t.Fatalf("a malformed answer:\n%s", body)
	}
	answer.Set("body", `{}`)
	answer.Set("status", "42")
	if body := post(answer, http.StatusBadRequest); !strings.Contains(body, "not a final HTTP status") {
		t.Fatalf("a bad status:\n%s", body)
	}
	inFlight()

	// Settle as failed, with a reason holding a script.
	settle := url.Values{"scope": {"acme"}, "key": {"pay-1"}, "action": {"settle-failed"}, "reason": {"<script>no charge at the network</script>"}, "confirm": {"yes"}}
	post(settle, http.StatusSeeOther)
	rec, err := store.Get(ctx, "acme", "pay-1")
	if err != nil || rec.State != idem.StateCompleted || rec.Response.Status != http.StatusConflict || rec.Response.Header.Get(console.SettledHeader) != "failed" {
		t.Fatalf("after the settle: %v %+v %v", rec.State, rec.Response, err)
	}
	if s := comp.Stats(); s.Unknown != 0 {
		t.Fatalf("unknown after the settle: %d; want 0", s.Unknown)
	}
	body = get(keyPage, http.StatusOK)
	for _, want := range []string{"settled by an operator", "settle-failed", "alice", "&lt;script&gt;no charge at the network&lt;/script&gt;", "settled (status 409)"} {
		if !strings.Contains(body, want) {
			t.Fatalf("after the settle the key's page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `id="act-resume"`) || strings.Contains(body, "<script>") {
		t.Fatalf("after the settle the key's page:\n%s", body)
	}
	if ov := get("/console/", http.StatusOK); !strings.Contains(ov, "0 unknown outcome(s)") {
		t.Fatalf("overview after the settle:\n%s", ov)
	}

	// Refused, changing nothing.
	if body := post(settle, http.StatusConflict); !strings.Contains(body, "completed") || !strings.Contains(body, "Nothing was changed") {
		t.Fatalf("a second settle:\n%s", body)
	}
	get("/console/outcomes/act?action=settle-failed&key=nope&scope=acme", http.StatusNotFound)
	get("/console/outcomes/act?action=settle-failed&key=&scope=acme", http.StatusBadRequest)
	get("/console/outcomes/act?action=explode&key=pay-1&scope=acme", http.StatusBadRequest)
	if rec := w.do(req{method: http.MethodPost, path: "/console/outcomes/act", form: settle, token: aliceToken,
		header: map[string]string{"Sec-Fetch-Site": "cross-site"}}); rec.Code != http.StatusForbidden {
		t.Fatalf("a cross-site settle: %d, want 403", rec.Code)
	}
	if rec := w.do(req{method: http.MethodPost, path: "/console/outcomes/act", form: settle}); rec.Code != http.StatusUnauthorized {
		t.Fatalf("a settle without a session: %d, want 401", rec.Code)
	}
}
