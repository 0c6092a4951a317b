package consoletest_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

const (
	aliceToken = "tok-alice-0123456789abcdef"
	bobToken   = "tok-bob-9876543210fedcba98"
)

// world is a console over a real, migrated payment database on SQLite,
// with letters added the way the settlement consumer adds them.
type world struct {
	t       *testing.T
	db      *idemsqlite.DB
	letters *idemsqlite.DeadLetters
	ledger  *idemsqlite.Ledger
	svc     *deadletter.Service
	con     *console.Console
	h       http.Handler
	logs    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newWorld(t *testing.T, cfg *console.Config) *world {
	t.Helper()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	w := &world{t: t, db: db, logs: &syncBuffer{}}
	if w.svc, err = payments.DeadLetterService(ctx, db); err != nil {
		t.Fatal(err)
	}
	if w.letters, err = idemsqlite.NewDeadLetters(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if w.ledger, err = idemsqlite.NewLedger(ctx, db); err != nil {
		t.Fatal(err)
	}
	in, err := payments.ConsoleInsights(db)
	if err != nil {
		t.Fatal(err)
	}
	var c console.Config
	if cfg != nil {
		c = *cfg
	}
	c.Letters, c.Insights = w.svc, in
	if c.Actions != nil && c.KeyHistory == nil {
		// The operators' actions on keys are kept in the payment
		// database, as the service keeps them.
		if err := payments.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
		if c.KeyHistory, err = payments.KeyHistory(db); err != nil {
			t.Fatal(err)
		}
	}
	c.Operators = []console.Operator{{Name: "alice", Token: aliceToken}, {Name: "bob", Token: bobToken}}
	c.Logger = slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if w.con, err = console.New(&c); err != nil {
		t.Fatal(err)
	}
	w.h = w.con.Handler()
	return w
}

// add dead-letters m for consumer "settlement" and returns the letter's ID.
func (w *world) add(m idem.Message, class idem.DeadLetterClass, errText string, at time.Time) string {
	w.t.Helper()
	if m.Topic == "" {
		m.Topic = payments.TopicPaymentSucceeded
	}
	id, err := w.letters.Add(w.t.Context(), idem.DeadLetter{
		Consumer: payments.SettlementConsumer, Message: m, Class: class,
		Attempts:      []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: errText}},
		FirstFailedAt: at, LastFailedAt: at,
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return id
}

// holdAndPark holds m's key back behind id and parks later messages of it.
func (w *world) holdAndPark(id, key string, later ...idem.Message) {
	w.t.Helper()
	ctx := w.t.Context()
	if err := w.ledger.HoldBack(ctx, payments.SettlementConsumer, key, id); err != nil {
		w.t.Fatal(err)
	}
	for _, m := range later {
		m.Key = key
		if m.Topic == "" {
			m.Topic = payments.TopicPaymentSucceeded
		}
		if err := w.ledger.Park(ctx, payments.SettlementConsumer, m); err != nil {
			w.t.Fatal(err)
		}
	}
}

type req struct {
	method, path string
	form         url.Values
	token        string
	cookie       *http.Cookie
	header       map[string]string
	remote       string // the client's address; httptest's default when empty
}

// act posts a confirmed action on a key (form) as alice.
func (w *world) act(form url.Values) *httptest.ResponseRecorder {
	w.t.Helper()
	return w.do(req{method: http.MethodPost, path: "/console/outcomes/act", form: form, token: aliceToken})
}

func (w *world) do(r req) *httptest.ResponseRecorder {
	w.t.Helper()
	var body *strings.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	} else {
		body = strings.NewReader("")
	}
	hr := httptest.NewRequestWithContext(w.t.Context(), cmpOr(r.method, http.MethodGet), r.path, body)
	if r.form != nil {
		hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.cookie != nil {
		hr.AddCookie(r.cookie)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	if r.remote != "" {
		hr.RemoteAddr = r.remote
	}
	rec := httptest.NewRecorder()
	w.h.ServeHTTP(rec, hr)
	return rec
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (w *world) letter(id string) idem.DeadLetter {
	w.t.Helper()
	dl, err := w.svc.Show(w.t.Context(), id)
	if err != nil {
		w.t.Fatal(err)
	}
	return dl
}

var t0 = time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	if _, err := console.New(&console.Config{Letters: w.svc}); !errors.Is(err, console.ErrNoOperators) {
		t.Errorf("New without operators = %v, want ErrNoOperators", err)
	}
	if _, err := console.New(&console.Config{Operators: []console.Operator{{Name: "a", Token: "t"}}}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("New without Letters = %v, want ErrInvalidArgument", err)
	}
	dup := []console.Operator{{Name: "a", Token: "a-token-of-32-characters-long-00"}, {Name: "b", Token: "a-token-of-32-characters-long-00"}}
	if _, err := console.New(&console.Config{Letters: w.svc, Operators: dup}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("New with a shared token = %v, want ErrInvalidArgument", err)
	}
}

func TestParseOperators(t *testing.T) {
	t.Parallel()
	ops, err := console.ParseOperators(" alice:s3cret , bob:t0ken ")
	if err != nil || len(ops) != 2 || ops[0] != (console.Operator{Name: "alice", Token: "s3cret"}) || ops[1].Name != "bob" {
		t.Fatalf("ParseOperators = %+v, %v", ops, err)
	}
	for _, bad := range []string{"", " , ", "alice", "alice:", ":tok", "alice:a b", "alice:x,alice:y", "alice:x,bob:x"} {
		_, err := console.ParseOperators(bad)
		if err == nil {
			t.Errorf("ParseOperators(%q) succeeded", bad)
			continue
		}
		for _, secret := range []string{"x", "y", "tok"} {
			if strings.Contains(bad, ":"+secret) && strings.Contains(err.Error(), secret+"\"") {
				t.Errorf("ParseOperators(%q) error %q quotes a token", bad, err)
			}
		}
	}
	if _, err := console.ParseOperators(""); !errors.Is(err, console.ErrNoOperators) {
		t.Errorf("ParseOperators(\"\") = %v, want ErrNoOperators", err)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	// Nothing, a wrong token, a wrong scheme: 401 and the login form.
	for _, r := range []req{
		{path: "/console/letters"},
		{path: "/console/letters", token: "nope"},
		{path: "/console/letters", header: map[string]string{"Authorization": "Basic " + aliceToken}},
		{path: "/console/letters", cookie: &http.Cookie{Name: "idem_console", Value: "forged"}},
		{method: http.MethodPost, path: "/console/bulk", form: url.Values{"action": {"redrive"}, "id": {"x"}}},
	} {
		rec := w.do(r)
		if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), `name="token"`) {
			t.Errorf("%s %s (token %q): %d, want 401 with the login form", cmpOr(r.method, "GET"), r.path, r.token, rec.Code)
		}
	}
	if rec := w.do(req{path: "/console/letters", token: aliceToken}); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), ">alice<") {
		t.Errorf("with alice's token: %d, want 200 naming alice", rec.Code)
	}
	// The stylesheet needs no login: the login page uses it.
	if rec := w.do(req{path: "/console/static/style.css"}); rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Content-Type"), "css") {
		t.Errorf("style.css: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}

	// Logging in sets an HttpOnly, SameSite=Strict cookie and leads back.
	rec := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {bobToken}, "next": {"/console/letters?class=permanent"}}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/console/letters?class=permanent" {
		t.Fatalf("login: %d to %q", rec.Code, rec.Header().Get("Location"))
	}
	cookies := rec.Result().Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Value == "" || strings.Contains(cookies[0].Value, bobToken) {
		t.Fatalf("login cookie %+v: want one HttpOnly SameSite=Strict session cookie, not the token", cookies)
	}
	ck := cookies[0]
	if rec := w.do(req{path: "/console/", cookie: ck}); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), ">bob<") {
		t.Errorf("with the session: %d, want 200 naming bob", rec.Code)
	}
	// A login never leads off the console.
	for _, next := range []string{"https://evil.example/", "//evil.example/console/", "/elsewhere"} {
		rec := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {bobToken}, "next": {next}}})
		if loc := rec.Header().Get("Location"); loc != "/console/" {
			t.Errorf("login with next=%q leads to %q, want /console/", next, loc)
		}
	}
	if rec := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {"wrong"}}}); rec.Code != http.StatusUnauthorized || len(rec.Result().Cookies()) != 0 {
		t.Errorf("login with a wrong token: %d, cookies %v", rec.Code, rec.Result().Cookies())
	}
	// Logging out ends the session.
	if rec := w.do(req{method: http.MethodPost, path: "/console/logout", cookie: ck}); rec.Code != http.StatusSeeOther {
		t.Errorf("logout: %d", rec.Code)
	}
	if rec := w.do(req{path: "/console/", cookie: ck}); rec.Code != http.StatusUnauthorized {
		t.Errorf("after logout: %d, want 401", rec.Code)
	}
	// No token is ever logged.
	if logs := w.logs.String(); strings.Contains(logs, aliceToken) || strings.Contains(logs, bobToken) || strings.Contains(logs, ck.Value) {
		t.Errorf("a token or session ID is in the log:\n%s", logs)
	}
}

func TestSessionExpires(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(t0)
	w := newWorld(t, &console.Config{Clock: clock, SessionTTL: time.Hour})
	rec := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {aliceToken}}})
	ck := rec.Result().Cookies()[0]
	if rec := w.do(req{path: "/console/", cookie: ck}); rec.Code != http.StatusOK {
		t.Fatalf("fresh session: %d", rec.Code)
	}
	clock.Advance(time.Hour)
	if rec := w.do(req{path: "/console/", cookie: ck}); rec.Code != http.StatusUnauthorized {
		t.Errorf("session past its TTL: %d, want 401", rec.Code)
	}
}

func TestCrossSiteRequestsRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	id := w.add(idem.Message{ID: "evt-1", Key: "acct-1", Payload: []byte(`{"event_id":"evt-1"}`)}, idem.DeadPermanent, "boom", t0)
	login := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {aliceToken}}})
	ck := login.Result().Cookies()[0]
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "https://evil.example"},
	} {
		rec := w.do(req{method: http.MethodPost, path: "/console/letters/" + id + "/redrive", cookie: ck, header: h})
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "Cross-site request refused") {
			t.Errorf("cross-site redrive with %v: %d, want 403", h, rec.Code)
		}
		// A login from another site is refused too (login CSRF).
		if rec := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {aliceToken}}, header: h}); rec.Code != http.StatusForbidden {
			t.Errorf("cross-site login with %v: %d, want 403", h, rec.Code)
		}
	}
	if dl := w.letter(id); dl.State != idem.LetterDead {
		t.Fatalf("after cross-site requests the letter is %s, want dead", dl.State)
	}
	// The same request from the console's own page goes through.
	rec := w.do(req{method: http.MethodPost, path: "/console/letters/" + id + "/redrive", cookie: ck, header: map[string]string{"Sec-Fetch-Site": "same-origin"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("same-origin redrive: %d\n%s", rec.Code, rec.Body)
	}
	if dl := w.letter(id); dl.State != idem.LetterRedriven || dl.History[len(dl.History)-1].Actor != "alice" {
		t.Errorf("after the redrive: %s, history %+v", dl.State, dl.History)
	}
	// Pages say they must not be framed or cached, and run no script.
	rec = w.do(req{path: "/console/letters/" + id, token: aliceToken})
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if rec.Header().Get("Cache-Control") != "no-store" || strings.Contains(rec.Body.String(), "<script") {
		t.Errorf("Cache-Control %q, or a script in the page", rec.Header().Get("Cache-Control"))
	}
}

func TestLetterPage(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	id := w.add(idem.Message{ID: "evt-1", Key: "acct-1", Headers: map[string]string{"Content-Type": "application/json", "Trace": "<b>x</b>"},
		Payload: []byte(`{"event_id":"evt-1","amount":1250,"ok":true,"note":"<script>alert(1)</script>"}`)}, idem.DeadPermanent, "event disagrees with payment", t0)
	w.holdAndPark(id, "acct-1",
		idem.Message{ID: "evt-2", Payload: []byte(`{"event_id":"evt-2"}`)},
		idem.Message{ID: "evt-3", Payload: []byte(`{"event_id":"evt-3"}`)})

	rec := w.do(req{path: "/console/letters/" + id, token: aliceToken})
	body := rec.Body.String()
	if rec.Code != http.StatusOK {
		t.Fatalf("letter page: %d\n%s", rec.Code, body)
	}
	for _, want := range []string{
		`<span class="key">&#34;amount&#34;</span>`, `<span class="num">1250</span>`, `<span class="lit">true</span>`,
		`&lt;script&gt;alert(1)&lt;/script&gt;`, `&lt;b&gt;x&lt;/b&gt;`, "event disagrees with payment", "dead-lettered",
		"2 messages of this key wait", "payments.succeeded", "acct-1",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("letter page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script>") || strings.Contains(body, "<b>x</b>") {
		t.Error("the page holds the payload's or a header's markup unescaped")
	}
	if i2, i3 := strings.Index(body, "evt-2"), strings.Index(body, "evt-3"); i2 < 0 || i3 < i2 {
		t.Errorf("parked messages not shown in order: evt-2 at %d, evt-3 at %d", i2, i3)
	}
	// Reading the page parked nothing out: the messages still wait.
	if n, _ := w.parked(id); n != 2 {
		t.Errorf("after the page, %d messages parked, want 2", n)
	}
	// The list shows the parked count.
	if body := w.do(req{path: "/console/letters", token: aliceToken}).Body.String(); !regexp.MustCompile(`<td class="n">2</td>`).MatchString(body) {
		t.Errorf("the list does not show 2 parked messages:\n%s", body)
	}
	if rec := w.do(req{path: "/console/letters/dl_nope", token: aliceToken}); rec.Code != http.StatusNotFound {
		t.Errorf("unknown letter: %d, want 404", rec.Code)
	}
	if rec := w.do(req{path: "/console/letters/dl_nope/edit", token: aliceToken}); rec.Code != http.StatusNotFound {
		t.Errorf("editing an unknown letter: %d, want 404", rec.Code)
	}
	if rec := w.do(req{method: http.MethodPost, path: "/console/letters/dl_nope/redrive", token: aliceToken}); rec.Code != http.StatusNotFound {
		t.Errorf("re-driving an unknown letter: %d, want 404", rec.Code)
	}
}

func (w *world) parked(id string) (int, error) {
	in, err := payments.ConsoleInsights(w.db)
	if err != nil {
		return 0, err
	}
	m, err := in.ParkedCounts(context.Background())
	return m[id], err
}

func TestPayloadShownSafely(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	text := w.add(idem.Message{ID: "m-text", Key: "k", Payload: []byte("{not json\u202e gnp.exe\x1b[31m")}, idem.DeadPermanent, "malformed", t0)
	bin := w.add(idem.Message{ID: "m-bin", Key: "k2", Payload: []byte{0xff, 0x00, 0x01, 0x02, 0xfe}}, idem.DeadPermanent, "malformed", t0)
	body := w.do(req{path: "/console/letters/" + text, token: aliceToken}).Body.String()
	if !strings.Contains(body, `<span class="esc">\u202e</span>`) || !strings.Contains(body, `<span class="esc">\u001b</span>`) || strings.Contains(body, "\u202e") || strings.Contains(body, "\x1b") {
		t.Errorf("invisible characters of a text payload are not shown as escapes:\n%s", body)
	}
	body = w.do(req{path: "/console/letters/" + bin, token: aliceToken}).Body.String()
	if !strings.Contains(body, "binary, 5 bytes") || !strings.Contains(body, "ff 00 01 02 fe") {
		t.Errorf("a binary payload is not shown as hex:\n%s", body)
	}
	if rec := w.do(req{path: "/console/letters/" + bin + "/edit", token: aliceToken}); rec.Code != http.StatusBadRequest {
		t.Errorf("editing a binary payload in the form: %d, want 400", rec.Code)
	}
}

func TestEditAndRedrive(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	orig := `{"event_id":"evt-1","amount":999}`
	id := w.add(idem.Message{ID: "evt-1", Key: "acct-1", Payload: []byte(orig)}, idem.DeadPermanent, "event disagrees", t0)
	w.holdAndPark(id, "acct-1", idem.Message{ID: "evt-2", Payload: []byte(`{"event_id":"evt-2"}`)})

	rec := w.do(req{path: "/console/letters/" + id + "/edit", token: aliceToken})
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "&#34;amount&#34;: 999") {
		t.Fatalf("edit form: %d\n%s", rec.Code, rec.Body)
	}
	// Invalid JSON: refused with the parser's message, the text kept.
	bad := "{\n  \"event_id\": \"evt-1\",\n  \"amount\": 12x00\n}"
	rec = w.do(req{method: http.MethodPost, path: "/console/letters/" + id + "/edit", token: aliceToken, form: url.Values{"payload": {bad}}})
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid character &#39;x&#39; after object key:value pair") ||
		!strings.Contains(rec.Body.String(), "line 3, column 15") || !strings.Contains(rec.Body.String(), "12x00") {
		t.Fatalf("invalid JSON: %d\n%s", rec.Code, rec.Body)
	}
	// Unchanged: refused.
	rec = w.do(req{method: http.MethodPost, path: "/console/letters/" + id + "/edit", token: aliceToken, form: url.Values{"payload": {"{\"event_id\": \"evt-1\", \"amount\": 999}"}}})
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "unchanged") {
		t.Fatalf("unchanged edit: %d\n%s", rec.Code, rec.Body)
	}
	if dl := w.letter(id); dl.State != idem.LetterDead || len(dl.History) != 1 {
		t.Fatalf("after refused edits the letter is %s with %d events, want dead, untouched", dl.State, len(dl.History))
	}
	rec = w.do(req{method: http.MethodPost, path: "/console/letters/" + id + "/edit", token: aliceToken,
		form: url.Values{"payload": {"{\r\n  \"event_id\": \"evt-1\",\r\n  \"amount\": 1200\r\n}\r\n"}, "reason": {"amount fixed from the ledger"}}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/console/letters/"+id+"?done=edited" {
		t.Fatalf("valid edit: %d to %q\n%s", rec.Code, rec.Header().Get("Location"), rec.Body)
	}
	dl := w.letter(id)
	ev := dl.History[len(dl.History)-1]
	if dl.State != idem.LetterRedriven || ev.Actor != "alice" || ev.Action != "edited and redriven" || ev.Reason != "amount fixed from the ledger" {
		t.Errorf("after the edit: %s, last event %+v", dl.State, ev)
	}
	if string(dl.Message.Payload) != orig {
		t.Errorf("the letter's payload became %s; it must keep the original", dl.Message.Payload)
	}
	entries := w.outbox()
	if len(entries) != 2 || entries[0] != `{"event_id":"evt-1","amount":1200}` || entries[1] != `{"event_id":"evt-2"}` {
		t.Errorf("outbox = %q, want the edited event compacted, then the parked one", entries)
	}
	body := w.do(req{path: "/console/letters/" + id + "?done=edited", token: aliceToken}).Body.String()
	if !strings.Contains(body, "Edited and re-driven") || !strings.Contains(body, "Not processed by settlement yet") {
		t.Errorf("letter page after the edit:\n%s", body)
	}
	// A second edit (another tab) is refused, naming who acted first.
	rec = w.do(req{method: http.MethodPost, path: "/console/letters/" + id + "/edit", token: bobToken, form: url.Values{"payload": {`{"event_id":"evt-1","amount":1}`}}})
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "already edited and redriven by alice") {
		t.Errorf("second edit: %d\n%s", rec.Code, rec.Body)
	}
	if n := len(w.outbox()); n != 2 {
		t.Errorf("after the refused second edit the outbox holds %d messages, want 2", n)
	}
}

// outbox returns the payloads waiting in the outbox, in order.
func (w *world) outbox() []string {
	w.t.Helper()
	rows, err := w.db.Reader().QueryContext(w.t.Context(), `SELECT payload FROM idem_outbox ORDER BY seq`)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p []byte
		if err := rows.Scan(&p); err != nil {
			w.t.Fatal(err)
		}
		out = append(out, string(p))
	}
	return out
}

func TestRedriveTwiceAndDiscard(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	a := w.add(idem.Message{ID: "evt-a", Key: "k-a", Payload: []byte(`{}`)}, idem.DeadExhausted, "timeout", t0)
	b := w.add(idem.Message{ID: "evt-b", Key: "k-b", Payload: []byte(`{}`)}, idem.DeadPermanent, "malformed", t0)

	if rec := w.do(req{method: http.MethodPost, path: "/console/letters/" + a + "/redrive", token: bobToken, form: url.Values{"reason": {"service back"}}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("redrive: %d\n%s", rec.Code, rec.Body)
	}
	rec := w.do(req{method: http.MethodPost, path: "/console/letters/" + a + "/redrive", token: aliceToken})
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "already redriven by bob") || !strings.Contains(rec.Body.String(), "service back") {
		t.Errorf("second redrive: %d\n%s", rec.Code, rec.Body)
	}
	if n := len(w.outbox()); n != 1 {
		t.Errorf("outbox holds %d messages after two redrives, want 1", n)
	}
	for _, reason := range []string{"", "   "} {
		rec := w.do(req{method: http.MethodPost, path: "/console/letters/" + b + "/discard", token: aliceToken, form: url.Values{"reason": {reason}}})
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "A reason is required") {
			t.Errorf("discard with reason %q: %d", reason, rec.Code)
		}
	}
	if dl := w.letter(b); dl.State != idem.LetterDead {
		t.Fatalf("after refused discards: %s", dl.State)
	}
	if rec := w.do(req{method: http.MethodPost, path: "/console/letters/" + b + "/discard", token: aliceToken, form: url.Values{"reason": {"not an event"}}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("discard: %d\n%s", rec.Code, rec.Body)
	}
	dl := w.letter(b)
	if ev := dl.History[len(dl.History)-1]; dl.State != idem.LetterDiscarded || ev.Actor != "alice" || ev.Reason != "not an event" {
		t.Errorf("after the discard: %s, %+v", dl.State, ev)
	}
	// Nothing is deleted: both letters are still listed under "all".
	body := w.do(req{path: "/console/letters?state=all", token: aliceToken}).Body.String()
	if !strings.Contains(body, a) || !strings.Contains(body, b) || !strings.Contains(body, "<strong>2</strong> letters match") {
		t.Errorf("state=all does not list both letters:\n%s", body)
	}
}

func TestListFiltersAndPaging(t *testing.T) {
	t.Parallel()
	w := newWorld(t, &console.Config{PageSize: 2})
	var ids []string
	for i, e := range []string{"timeout talking to bank", "malformed event", "Timeout again", "unknown payment", "timeout #3"} {
		class := idem.DeadPermanent
		if strings.Contains(strings.ToLower(e), "timeout") {
			class = idem.DeadExhausted
		}
		ids = append(ids, w.add(idem.Message{ID: "m" + string(rune('0'+i)), Key: "k", Payload: []byte(`{}`)}, class, e, t0.Add(time.Duration(i)*time.Minute)))
	}
	// Most recent first: m4, m3, m2, m1, m0. Text search ignores case.
	body := w.do(req{path: "/console/letters?q=TIMEOUT", token: aliceToken}).Body.String()
	if !strings.Contains(body, "<strong>3</strong> letters match") || !strings.Contains(body, ids[4]) || !strings.Contains(body, ids[2]) || strings.Contains(body, ids[0]) {
		t.Errorf("q=TIMEOUT page 1:\n%s", body)
	}
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatalf("no next page link:\n%s", body)
	}
	body = w.do(req{path: strings.ReplaceAll(next[1], "&amp;", "&"), token: aliceToken}).Body.String()
	if !strings.Contains(body, ids[0]) || strings.Contains(body, ids[4]) || strings.Contains(body, `id="next"`) {
		t.Errorf("q=TIMEOUT page 2:\n%s", body)
	}
	body = w.do(req{path: "/console/letters?class=permanent", token: aliceToken}).Body.String()
	if !strings.Contains(body, "<strong>2</strong> letters match") || !strings.Contains(body, ids[1]) || !strings.Contains(body, ids[3]) {
		t.Errorf("class=permanent:\n%s", body)
	}
	body = w.do(req{path: "/console/letters?since=2026-05-01T09:03:00Z", token: aliceToken}).Body.String()
	if !strings.Contains(body, "<strong>2</strong> letters match") {
		t.Errorf("since:\n%s", body)
	}
	// The summary counts every dead letter, with the oldest's age.
	if !strings.Contains(body, "<strong>5</strong> dead in") {
		t.Errorf("summary:\n%s", body)
	}
	for _, bad := range []string{"class=transient", "state=gone", "since=yesterday"} {
		if rec := w.do(req{path: "/console/letters?" + bad, token: aliceToken}); rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, rec.Code)
		}
	}
}

func TestBulkPreviewThenConfirm(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	a := w.add(idem.Message{ID: "m-a", Key: "k-a", Payload: []byte(`{}`)}, idem.DeadExhausted, "timeout", t0)
	b := w.add(idem.Message{ID: "m-b", Key: "k-b", Payload: []byte(`{}`)}, idem.DeadExhausted, "timeout", t0.Add(time.Minute))
	c := w.add(idem.Message{ID: "m-c", Key: "k-c", Payload: []byte(`{}`)}, idem.DeadPermanent, "malformed", t0)
	w.holdAndPark(b, "k-b", idem.Message{ID: "m-b2", Payload: []byte(`{}`)})

	rec := w.do(req{path: "/console/bulk?action=redrive&class=exhausted", token: aliceToken})
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(body, `<span id="preview-count">2</span>`) || !strings.Contains(body, a) || !strings.Contains(body, b) || strings.Contains(body, c) {
		t.Fatalf("preview: %d\n%s", rec.Code, body)
	}
	if strings.Index(body, `name="id" value="`+a) > strings.Index(body, `name="id" value="`+b) {
		t.Error("the preview does not list the oldest first")
	}
	if w.letter(a).State != idem.LetterDead || len(w.outbox()) != 0 {
		t.Fatal("the preview changed something")
	}
	if n, _ := w.parked(b); n != 1 {
		t.Fatalf("after the preview %d parked, want 1", n)
	}
	if rec := w.do(req{path: "/console/bulk?action=discard&state=redriven", token: aliceToken}); rec.Code != http.StatusBadRequest {
		t.Errorf("bulk on redriven letters: %d, want 400", rec.Code)
	}
	if rec := w.do(req{method: http.MethodPost, path: "/console/bulk", token: aliceToken, form: url.Values{"action": {"discard"}, "id": {a, b}}}); rec.Code != http.StatusBadRequest {
		t.Errorf("bulk discard without a reason: %d, want 400", rec.Code)
	}
	// Confirmed: exactly the previewed letters.
	rec = w.do(req{method: http.MethodPost, path: "/console/bulk", token: aliceToken, form: url.Values{"action": {"redrive"}, "id": {a, b}, "reason": {"bank is back"}}})
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "Re-driven: 2 letters") {
		t.Fatalf("confirm: %d\n%s", rec.Code, rec.Body)
	}
	for _, id := range []string{a, b} {
		dl := w.letter(id)
		if ev := dl.History[len(dl.History)-1]; dl.State != idem.LetterRedriven || ev.Actor != "alice" || ev.Reason != "bank is back" {
			t.Errorf("%s after the bulk redrive: %s %+v", id, dl.State, ev)
		}
	}
	if w.letter(c).State != idem.LetterDead {
		t.Error("a letter not previewed was changed")
	}
	if n := len(w.outbox()); n != 3 {
		t.Errorf("outbox holds %d, want 3 (two letters and the parked message)", n)
	}
	// Confirming a stale preview changes nothing and says why.
	rec = w.do(req{method: http.MethodPost, path: "/console/bulk", token: bobToken, form: url.Values{"action": {"redrive"}, "id": {b, c}}})
	if rec.Code != http.StatusConflict || w.letter(c).State != idem.LetterDead {
		t.Errorf("stale confirm: %d, c is %s\n%s", rec.Code, w.letter(c).State, rec.Body)
	}
}

func TestOverview(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	now := time.Now()
	w.add(idem.Message{ID: "m-a", Key: "k-a", Payload: []byte(`{}`)}, idem.DeadExhausted, "timeout", now.Add(-10*time.Minute))
	body := w.do(req{path: "/console/", token: aliceToken}).Body.String()
	for _, want := range []string{"Dead letters waiting", ">settlement<", "Consumers, last 1h", "outbox", "settlement lag"} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q:\n%s", want, body)
		}
	}
	if !regexp.MustCompile(`(?s)<td>settlement</td><td class="n">0</td><td class="n">0</td>\s*<td class="n">1</td>`).MatchString(body) {
		t.Errorf("overview does not count one dead-lettered message:\n%s", body)
	}
}
