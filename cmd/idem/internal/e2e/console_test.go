package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

// requireChromium is the gate for browser tests: the path of a Chromium
// binary, or a skip (a failure under IDEM_REQUIRE_SERVICES=1) naming what
// installs it.
func requireChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	requirePrerequisite(t, "no chromium on PATH (scripts/tools installs Debian's chromium package)")
	return ""
}

// TestConsoleInBrowser drives the operators' console of a real `idem
// serve --console` with headless Chromium: a poison event appears in the
// list; an operator logs in, opens it, reads the payload and the message
// parked behind it, fixes the payload in the editor (an invalid edit
// first, which is refused), re-drives it and sees it settled. Discarding
// without a reason is refused; a second action on a letter another
// operator resolved first is refused naming them; a request without a
// session or token is refused; a cross-site POST is refused even with the
// session cookie. Each page is saved as a screenshot in the test's
// artifact directory, which the test prints (kept with go test -artifacts).
func TestConsoleInBrowser(t *testing.T) {
	chromium := requireChromium(t)
	shots := t.ArtifactDir()
	t.Logf("console screenshots in %s", shots)
	fmt.Fprintf(os.Stderr, "e2e: console screenshots in %s\n", shots)

	dir := t.TempDir()
	dbPath := filepath.Join(dir, "idem.db")
	db := "sqlite:" + dbPath
	e := &testEnv{t: t, tenant: "tenant_" + randHex(4), apiKey: "sk_e2e_" + randHex(16),
		hc: &http.Client{Transport: newHTTPTransport(), Timeout: 30 * time.Second}}
	t.Cleanup(e.hc.CloseIdleConnections)
	aliceToken, bobToken := "op_alice_"+randHex(12), "op_bob_"+randHex(12)
	apiKeys := e.tenant + ":" + e.apiKey

	// A payment whose event waits in the outbox: no relay runs yet.
	first := launch(t, "requests-only", "serve", "--addr", "127.0.0.1:0", "--db", db, "--api-keys", apiKeys, "--workers=false").ready(t, e.hc)
	acct := e.createAccount(t, first.URL, 100000)
	var p payment
	e.call(t, http.MethodPost, first.URL+"/v1/payments", paymentBody(acct, 1200, "console-pay"), http.StatusCreated, &p)
	first.expectExit.Store(true)
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	first.waitExit(t)

	// Poison goes onto the transport before the relay publishes the real
	// event: a tampered copy of the payment's event (its amount is wrong),
	// so that the real one, of the same key, is parked behind it; and two
	// messages that are not events at all.
	tampered, _ := json.Marshal(payments.PaymentEvent{EventID: "evt_console_" + randHex(4), Type: payments.EventPaymentSucceeded,
		PaymentID: p.ID, Tenant: e.tenant, AccountID: acct, Amount: 999999, Currency: currency, OccurredAt: time.Now().UTC()})
	publishPoison(t, dbPath,
		idem.Message{ID: "poison-amount", Topic: payments.TopicPaymentSucceeded, Key: acct, Payload: tampered,
			Headers: map[string]string{"Content-Type": "application/json"}},
		idem.Message{ID: "poison-junk", Topic: payments.TopicPaymentSucceeded, Key: "k-junk", Payload: []byte("{not json")},
		idem.Message{ID: "poison-csrf", Topic: payments.TopicPaymentSucceeded, Key: "k-csrf", Payload: []byte("{still not json")})

	srv := launch(t, "console", "serve", "--addr", "127.0.0.1:0", "--db", db, "--api-keys", apiKeys,
		"--console", "--operators", "alice:"+aliceToken+",bob:"+bobToken).ready(t, e.hc)
	base := srv.URL + "/console"

	// The letters appear; their IDs are read with bob's token.
	letterID := func(q string) string {
		var id string
		waitFor(t, "a dead letter whose last error holds "+q, 30*time.Second, func() bool {
			_, body := consoleGet(t, e.hc, base+"/letters?q="+url.QueryEscape(q), bobToken)
			_, rest, ok := strings.Cut(body, `class="letter-link" href="/console/letters/`)
			if ok {
				id, _, _ = strings.Cut(rest, `"`)
			}
			return ok
		})
		return id
	}
	amountID := letterID("disagrees with payment")
	var junkIDs []string
	waitFor(t, "two malformed letters", 30*time.Second, func() bool {
		_, body := consoleGet(t, e.hc, base+"/letters?q=malformed", bobToken)
		junkIDs = nil
		for _, part := range strings.Split(body, `class="letter-link" href="/console/letters/`)[1:] {
			id, _, _ := strings.Cut(part, `"`)
			junkIDs = append(junkIDs, id)
		}
		return len(junkIDs) == 2
	})
	junkID, csrfID := junkIDs[0], junkIDs[1]

	// Without a session or a token: refused.
	if code, body := consoleGet(t, e.hc, base+"/letters", ""); code != http.StatusUnauthorized || !strings.Contains(body, `name="token"`) {
		t.Errorf("GET without a session: %d, want 401 and the login form", code)
	}
	if code := consolePost(t, e.hc, base+"/letters/"+junkID+"/redrive", "", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("POST without a session: %d, want 401", code)
	}
	if code := consolePost(t, e.hc, base+"/letters/"+junkID+"/redrive", e.apiKey, nil, nil); code != http.StatusUnauthorized {
		t.Errorf("POST with a tenant's API key: %d, want 401", code)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1366, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()

	step := func(name string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, actions...); err != nil {
			loc, _ := chromedp.Run(bctx, chromedp.Location())
			t.Fatalf("%s: %v (at %s)", name, err, loc)
		}
	}
	textOf := func(sel string) string {
		t.Helper()
		text, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("reading %s: %v", sel, err)
		}
		return text
	}
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(filepath.Join(shots, name+".png"), buf, 0o644)
		}
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
	}
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }

	// Log in: the list page asks for it, then comes back.
	step("open the list", chromedp.Navigate(base+"/letters"), chromedp.WaitVisible(css("#token")))
	shot("01-login")
	step("log in", chromedp.SendKeys(css("#token"), aliceToken), chromedp.Submit(css("#token")), chromedp.WaitVisible(css("#letters")))
	if text := textOf("#letters"); !strings.Contains(text, "disagrees with payment") || !strings.Contains(text, "malformed") {
		t.Errorf("the list does not show the poison events:\n%s", text)
	}
	if text := textOf("#operator"); text != "alice" {
		t.Errorf("signed in as %q, want alice", text)
	}
	shot("02-list")

	// Open the poison event and read it.
	step("filter and open", chromedp.Navigate(base+"/letters?q=disagrees"), chromedp.Click(css("a.letter-link")), chromedp.WaitVisible(css("#payload")))
	if loc, _ := chromedp.Run(bctx, chromedp.Location()); !strings.HasSuffix(loc, "/letters/"+amountID) {
		t.Errorf("the link led to %s, want the letter %s", loc, amountID)
	}
	if text := textOf("#payload"); !strings.Contains(text, `"amount": 999999`) || !strings.Contains(text, p.ID) {
		t.Errorf("the payload is not shown pretty-printed:\n%s", text)
	}
	if text := textOf("#parked-count"); !strings.Contains(text, "1 message of this key waits") {
		t.Errorf("parked behind it: %q, want the payment's own event", text)
	}
	if text := textOf("#attempts"); !strings.Contains(text, "permanent") || !strings.Contains(text, "disagrees with payment") {
		t.Errorf("attempts: %q", text)
	}
	shot("03-letter")

	// Fix it in the editor: invalid JSON first, refused.
	step("edit", chromedp.Click(css("#edit-link")), chromedp.WaitVisible(css("textarea#payload")),
		chromedp.SetValue(css("textarea#payload"), `{"event_id": "broken",`), chromedp.Submit(css("textarea#payload")),
		chromedp.WaitVisible(css("#problem")))
	if text := textOf("#problem"); !strings.Contains(text, "not valid JSON") || !strings.Contains(text, "Nothing was changed") {
		t.Errorf("invalid edit: %q", text)
	}
	shot("04-edit-invalid")
	fixed := strings.Replace(string(tampered), `"amount":999999`, `"amount":1200`, 1)
	step("fix", chromedp.SetValue(css("textarea#payload"), fixed), chromedp.SetValue(css("#edit-reason"), "amount corrected from the payment"),
		chromedp.Submit(css("textarea#payload")), chromedp.WaitVisible(css("#done")))
	if text := textOf("#history"); !strings.Contains(text, "alice") || !strings.Contains(text, "edited and redriven") || !strings.Contains(text, "amount corrected from the payment") {
		t.Errorf("history after the edit:\n%s", text)
	}
	shot("05-redriven")

	// Settled: the page says so once the consumer has processed it.
	waitFor(t, "the letter page to say it was settled", 30*time.Second, func() bool {
		step("reload", chromedp.Reload(), chromedp.WaitVisible(css("#processed")))
		return strings.Contains(textOf("#processed"), "settled")
	})
	shot("06-settled")
	var st payments.Settlement
	e.call(t, http.MethodGet, srv.URL+"/v1/settlement", nil, http.StatusOK, &st)
	if st.Total != 1200 || st.Events != 1 {
		t.Errorf("settlement = %+v, want the payment counted once: 1200 over 1 event", st)
	}

	// Discard without a reason: the browser's own check taken away, the
	// server refuses it.
	step("discard without a reason", chromedp.Navigate(base+"/letters/"+junkID), chromedp.WaitVisible(css("#discard")),
		chromedp.RemoveAttribute(css("#discard-reason"), "required"), chromedp.Submit(css("#discard-reason")),
		chromedp.WaitVisible(css("#heading")))
	if text := textOf("#heading"); text != "A reason is required" {
		t.Errorf("discard without a reason: %q", text)
	}
	shot("07-discard-no-reason")

	// Two tabs: bob re-drives the letter while alice's page is open; her
	// discard is refused, naming him.
	step("open the letter again", chromedp.Navigate(base+"/letters/"+junkID), chromedp.WaitVisible(css("#discard")))
	if code := consolePost(t, e.hc, base+"/letters/"+junkID+"/redrive", bobToken, url.Values{"reason": {"producer fixed"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("bob's redrive: %d", code)
	}
	step("discard after bob", chromedp.SendKeys(css("#discard-reason"), "not an event"), chromedp.Submit(css("#discard-reason")),
		chromedp.WaitVisible(css("#message")))
	if text := textOf("#message"); !strings.Contains(text, "already redriven by bob") || !strings.Contains(text, "producer fixed") {
		t.Errorf("the second action: %q, want it refused naming bob", text)
	}
	shot("08-conflict")

	// A cross-site POST, from a page of another origin, with the session
	// cookie the browser holds: refused, and the letter stays dead.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/letters/%s/discard">
<input type="hidden" name="reason" value="forged"><button id="go" type="submit">Win a prize</button></form>`, base, csrfID)
	}))
	defer evil.Close()
	step("cross-site form", chromedp.Navigate(evil.URL), chromedp.Click(css("#go")), chromedp.WaitVisible(css("#heading")))
	if text := textOf("#heading"); text != "Cross-site request refused" {
		t.Errorf("cross-site POST: %q", text)
	}
	shot("09-cross-site")
	if code, body := consoleGet(t, e.hc, base+"/letters/"+csrfID, aliceToken); code != http.StatusOK || !strings.Contains(body, `state-dead">dead<`) {
		t.Errorf("after the cross-site POST the letter is not dead any more (%d)", code)
	}
	if code := consolePost(t, e.hc, base+"/letters/"+csrfID+"/discard", aliceToken, url.Values{"reason": {"forged"}},
		map[string]string{"Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Errorf("POST with a foreign Origin: %d, want 403", code)
	}

	// The overview shows the consumer's outcomes and the backlogs.
	step("overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(css("#backlogs")))
	if text := textOf("#outcomes"); !strings.Contains(text, "settlement") {
		t.Errorf("overview outcomes: %q", text)
	}
	shot("10-overview")
	step("log out", chromedp.Click(css(".logout button")), chromedp.WaitVisible(css("#token")))

	cancelBrowser()
	cancelAlloc()
	if logs := srv.logs(); strings.Contains(logs, aliceToken) || strings.Contains(logs, bobToken) || strings.Contains(logs, "999999") {
		t.Errorf("a token or a payload is in serve's log:\n%s", logs)
	}
}

// publishPoison publishes msgs on the embedded transport of the SQLite
// database at path, as a producer would.
func publishPoison(t *testing.T, path string, msgs ...idem.Message) {
	t.Helper()
	ctx := t.Context()
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tr, err := idemsqlite.NewTransport(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

func consoleGet(t *testing.T, hc *http.Client, u, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// consolePost posts form, without following the redirect that answers
// success.
func consolePost(t *testing.T, hc *http.Client, u, token string, form url.Values, header map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
