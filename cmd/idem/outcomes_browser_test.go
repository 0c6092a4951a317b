package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// TestUnknownOutcomeInBrowser drives the console of a real `idem serve
// --acquirer --console` with headless Chromium, as the dead-letter pages
// are (internal/e2e's TestConsoleInBrowser). A replica dies right after
// the card network charged a payment; it comes back while the network is
// down, so its completer cannot learn the outcome: unknown, counted by
// idem_http_recovery_unknown. An operator finds it from the overview,
// reads it (its key, which holds a script, shown as text; its amount; its
// failed resume), and settles it with the answer they learned from the
// network, with a reason, on a confirmation page. Its history shows who,
// what and why; the client's next retry gets the settled answer; the
// metric drops to 0.
func TestUnknownOutcomeInBrowser(t *testing.T) {
	var chromium string
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		if os.Getenv(idemtest.RequireServicesEnv) == "1" {
			t.Fatalf("no chromium on PATH (scripts/tools installs Debian's chromium package); %s=1 requires it", idemtest.RequireServicesEnv)
		}
		t.Skipf("skipping: no chromium on PATH (scripts/tools installs Debian's chromium package); set %s=1 to fail instead", idemtest.RequireServicesEnv)
	}
	shots := t.ArtifactDir()

	// The card network, which the test can take down.
	adb, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adb.Close() })
	network, err := acquirer.New(t.Context(), acquirer.Config{DB: adb, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "card network down for maintenance", http.StatusServiceUnavailable)
			return
		}
		network.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)

	opToken := "op_alice_0123456789abcdef0123"
	a := startReplica(t, "browser", []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db"), "--acquirer", hs.URL, "--faults",
		"--key-lease", "1s", "--console", "--operators", "alice:" + opToken, "--log-level", "warn"})
	acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("creating the account: %s", acct)
	}
	const key = `<script>alert(1)</script>`
	pay := map[string]any{"account_id": acct.body["id"], "amount": 1234, "currency": "EUR"}
	crash(t, a, key, pay)
	down.Store(true)
	a.restart(t)

	unknown := func() float64 {
		resp, err := http.Get(a.base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return metricValue(string(b), `idem_http_recovery_unknown{middleware="payments"}`)
	}
	deadline := time.Now().Add(30 * time.Second)
	for unknown() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the payment did not become an unknown outcome: idem_http_recovery_unknown = %v\n%s", unknown(), a.log())
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
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
			t.Fatalf("%s: %v (at %s)\n%s", name, err, loc, a.log())
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
	base := a.base + "/console"

	step("log in", chromedp.Navigate(base+"/"), chromedp.WaitVisible(css("#token")),
		chromedp.SendKeys(css("#token"), opToken), chromedp.Submit(css("#token")), chromedp.WaitVisible(css("#stopped")))
	if text := textOf("#stopped"); !strings.Contains(text, "1 unknown outcome(s)") {
		t.Fatalf("the overview: %q; want one unknown outcome", text)
	}
	shot("outcomes-01-overview")
	step("open the unknown outcomes", chromedp.Click(css("#stopped a")), chromedp.WaitVisible(css("#outcomes")))
	if text := textOf("#outcomes"); !strings.Contains(text, "unknown") || !strings.Contains(text, key) || !strings.Contains(text, "1234 EUR") {
		t.Fatalf("the unknown outcomes: %q", text)
	}
	shot("outcomes-02-list")
	step("open the payment", chromedp.Click(css("#outcomes tbody a")), chromedp.WaitVisible(css("#point")))
	if text := textOf("#key"); text != key {
		t.Fatalf("the key is shown as %q; want its text %q", text, key)
	}
	if text := textOf("#point"); !strings.Contains(text, "1234 EUR") || !strings.Contains(text, "acme") {
		t.Fatalf("what the point says: %q", text)
	}
	if text := textOf("#point"); !strings.Contains(text, "card network's answer") || !strings.Contains(text, "cannot be read now") {
		t.Fatalf("the card network's answer while it is down: %q; want it said unreadable", text)
	}
	if text := textOf("#failures"); !strings.Contains(text, "503") && !strings.Contains(text, "unavailable") && !strings.Contains(text, "down") {
		t.Fatalf("the failed resumes: %q; want the card network's error", text)
	}
	shot("outcomes-03-key")

	// A round of the completer may be resuming the key right now (its
	// resumes fail every few seconds while the network is down): the page
	// then says "wait for it to end" and offers no action, as it should.
	// The operator reloads until the resume has ended and the actions are
	// offered.
	for {
		offered, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.querySelector("#act-settle-answer button") !== null`))
		if err != nil {
			t.Fatalf("looking for the actions: %v\n%s", err, a.log())
		}
		if offered {
			break
		}
		if text := textOf("#state"); !strings.Contains(text, "being resumed now") {
			t.Fatalf("no action offered, and the key is not being resumed: %q", text)
		}
		t.Log("a round is resuming the key: the page offers no action; reloading")
		step("reload the payment", chromedp.Reload(), chromedp.WaitVisible(css("#point")))
	}

	// The network says it charged: settle with that answer.
	step("settle with an answer", chromedp.Click(css("#act-settle-answer button")), chromedp.WaitVisible(css("#confirm")),
		chromedp.SetValue(css("#status"), "201"),
		chromedp.SetValue(css("#body"), `{"status":"succeeded","amount":1234,"currency":"EUR"}`),
		chromedp.SendKeys(css("#reason"), "the card network's statement shows the charge"),
		chromedp.Click(css("#confirm-box")))
	shot("outcomes-04-confirm")
	step("confirm", chromedp.Click(css("#do")), chromedp.WaitVisible(css("#done")))
	if text := textOf("#history"); !strings.Contains(text, "alice") || !strings.Contains(text, "settle-answer") ||
		!strings.Contains(text, "the card network's statement shows the charge") || !strings.Contains(text, "settled (status 201)") {
		t.Fatalf("the history: %q", text)
	}
	if text := textOf("#state"); !strings.Contains(text, "201") || !strings.Contains(text, "settled by an operator") {
		t.Fatalf("the key after the settle: %q", text)
	}
	shot("outcomes-05-settled")
	cancelBrowser()
	cancelAlloc()

	if v := unknown(); v != 0 {
		t.Fatalf("idem_http_recovery_unknown after the settle: %v; want 0", v)
	}
	if got := a.post(t, "/v1/payments", key, "", pay); got.status != http.StatusCreated || got.body["status"] != "succeeded" || got.body["amount"] != float64(1234) {
		t.Fatalf("the client's retry: %s; want the settled answer", got)
	}
	if strings.Contains(a.log(), opToken) {
		t.Error("the operator's token is in serve's log")
	}
}
