package consoletest_test

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemmem"
)

// The console mounted at "/" leads a login only to one of its own paths:
// next is parsed, and what a browser would read as another site (a tab or
// a newline it drops, a backslash it reads as a slash) leads home instead.
func TestLoginNextIsASameOriginPath(t *testing.T) {
	t.Parallel()
	w := newWorld(t, &console.Config{Prefix: "/"})
	for _, next := range []string{
		"/%09/evil.example", "/\t/evil.example", "/%0a/evil.example", "/%0d%0a/evil.example", "/\\evil.example",
		"/%5cevil.example", "//evil.example", "///evil.example", "https://evil.example/", "javascript:alert(1)",
		"/%20/evil.example", "//%09evil.example", "http:/evil.example", "\\\\evil.example", "/%2f%2fevil.example",
		"evil.example", "", "/letters\x00",
	} {
		rec := w.do(req{method: http.MethodPost, path: "/login", form: url.Values{"token": {bobToken}, "next": {next}}})
		if loc := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || loc != "/" {
			t.Errorf("login with next=%q: %d to %q; want / (home)", next, rec.Code, loc)
		}
	}
	rec := w.do(req{method: http.MethodPost, path: "/login", form: url.Values{"token": {bobToken}, "next": {"/letters?class=permanent"}}})
	if loc := rec.Header().Get("Location"); loc != "/letters?class=permanent" {
		t.Errorf("login with a path of the console leads to %q", loc)
	}
}

// The session cookie is Secure when the console is told that browsers reach
// it over https (a proxy terminates TLS), and not otherwise over plain http.
func TestSessionCookieSecureBehindHTTPS(t *testing.T) {
	t.Parallel()
	for _, public := range []bool{false, true} {
		w := newWorld(t, &console.Config{PublicHTTPS: public})
		rec := w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {aliceToken}}})
		cookies := rec.Result().Cookies()
		if len(cookies) != 1 || cookies[0].Secure != public {
			t.Errorf("PublicHTTPS %v: cookies %+v; want one, Secure %v", public, cookies, public)
		}
	}
}

// A brute-force loop of logins is stopped: five wrong tokens from one
// address, and the sixth attempt from it (the right token's included) is
// refused 429 with Retry-After until a minute has passed since the first;
// another address logs in meanwhile, and bearer tokens count the same.
func TestLoginAttemptsLimitedPerAddress(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w := newWorld(t, &console.Config{Clock: clock})
	login := func(token, from string) *http.Response {
		return w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {token}}, remote: from}).Result()
	}
	for i := range console.LoginFailures {
		if r := login("guess-"+strconv.Itoa(i), "198.51.100.7:4000"); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d; want 401", i, r.StatusCode)
		}
		clock.Advance(time.Second)
	}
	r := login(aliceToken, "198.51.100.7:4001")
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" || len(r.Cookies()) != 0 {
		t.Fatalf("the right token after %d failures: %d, Retry-After %q, cookies %v; want 429 and no session",
			console.LoginFailures, r.StatusCode, r.Header.Get("Retry-After"), r.Cookies())
	}
	if r := w.do(req{path: "/console/", token: aliceToken, remote: "198.51.100.7:4002"}).Result(); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a bearer token from the same address: %d; want 429", r.StatusCode)
	}
	if r := login(aliceToken, "203.0.113.9:4000"); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("another address: %d; want 303", r.StatusCode)
	}
	clock.Advance(console.LoginWindow)
	if r := login(aliceToken, "198.51.100.7:4003"); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("after the window: %d; want 303", r.StatusCode)
	}
}

// A brute-force loop spread over many addresses, each trying fewer than
// LoginFailures tokens, is stopped by the console's total: past
// LoginFailuresTotal failed logins within LoginWindow, every login by
// token is refused 429 with Retry-After, from any address, the right
// token's included, until the window has passed; a session opened before
// goes on meanwhile. The addresses of one IPv6 /64 count as one.
func TestLoginBruteForceFromManyAddressesStopped(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w := newWorld(t, &console.Config{Clock: clock})
	login := func(token, from string) *http.Response {
		return w.do(req{method: http.MethodPost, path: "/console/login", form: url.Values{"token": {token}}, remote: from}).Result()
	}
	open := login(aliceToken, "203.0.113.1:4000")
	if open.StatusCode != http.StatusSeeOther || len(open.Cookies()) != 1 {
		t.Fatalf("the login before the attack: %d", open.StatusCode)
	}
	checked, refused := 0, 0
	for i := range 200 {
		// Two guesses from each address: under the per-address limit.
		from := "198.51.100." + strconv.Itoa(i/2) + ":5000"
		switch r := login("guess-"+strconv.Itoa(i)+"-xxxxxxxxxxxxxxxxxxxxxx", from); r.StatusCode {
		case http.StatusUnauthorized:
			checked++
		case http.StatusTooManyRequests:
			if r.Header.Get("Retry-After") == "" {
				t.Fatalf("guess %d: 429 without Retry-After", i)
			}
			refused++
		default:
			t.Fatalf("guess %d: %d", i, r.StatusCode)
		}
	}
	if checked != console.LoginFailuresTotal || refused != 200-console.LoginFailuresTotal {
		t.Fatalf("of 200 guesses from 100 addresses, %d were checked and %d refused; want %d checked", checked, refused, console.LoginFailuresTotal)
	}
	if r := login(aliceToken, "203.0.113.2:4000"); r.StatusCode != http.StatusTooManyRequests || len(r.Cookies()) != 0 {
		t.Fatalf("the right token from a fresh address during the attack: %d, cookies %v; want 429", r.StatusCode, r.Cookies())
	}
	if r := w.do(req{path: "/console/", token: bobToken, remote: "203.0.113.3:4000"}).Result(); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a bearer token during the attack: %d; want 429", r.StatusCode)
	}
	if r := w.do(req{path: "/console/", cookie: open.Cookies()[0], remote: "203.0.113.1:4001"}).Result(); r.StatusCode != http.StatusOK {
		t.Fatalf("the session opened before the attack: %d; want 200", r.StatusCode)
	}
	clock.Advance(console.LoginWindow)
	if r := login(aliceToken, "203.0.113.2:4001"); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("after the window: %d; want 303", r.StatusCode)
	}

	// One IPv6 /64 is one address.
	for i := range console.LoginFailures {
		if r := login("guess-v6-xxxxxxxxxxxxxxxxxxxxxxx", "[2001:db8:0:7::"+strconv.Itoa(i+1)+"]:5000"); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("IPv6 guess %d: %d; want 401", i, r.StatusCode)
		}
	}
	if r := login(aliceToken, "[2001:db8:0:7::ffff]:5000"); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("another address of the same /64 after %d failures: %d; want 429", console.LoginFailures, r.StatusCode)
	}
	if r := login(aliceToken, "[2001:db8:0:8::1]:5000"); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("another /64: %d; want 303", r.StatusCode)
	}
}

// An operator token of 20 characters is refused, and the error does not
// quote it; one of MinTokenLen is accepted.
func TestShortOperatorTokenRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	short := "abcdefghij0123456789"
	_, err := console.New(&console.Config{Letters: w.svc, Operators: []console.Operator{{Name: "eve", Token: short}}})
	if !errors.Is(err, idem.ErrInvalidArgument) || strings.Contains(err.Error(), short) {
		t.Fatalf("New with a 20-character token: %v; want ErrInvalidArgument, the token unquoted", err)
	}
	ok := strings.Repeat("x", console.MinTokenLen)
	if _, err := console.New(&console.Config{Letters: w.svc, Operators: []console.Operator{{Name: "eve", Token: ok}}}); err != nil {
		t.Fatalf("New with a %d-character token: %v", console.MinTokenLen, err)
	}
}
