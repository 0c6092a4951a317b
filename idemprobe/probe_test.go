package idemprobe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/leakcheck"

	"github.com/idem-go/idem/idemprobe"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// flaw is the one thing a fake endpoint gets wrong.
type flaw int

const (
	correct                flaw = iota
	noAtomicClaim               // checks for a completed key, then runs: duplicates in flight run too
	noMismatchCheck             // replays the first answer whatever the body
	replaysCookies              // replays every header, Set-Cookie included
	keeps5xx                    // keeps and replays a 5xx
	noReplay                    // requires a key, and then ignores it
	cookiesToWaiters            // replays Set-Cookie to a duplicate that waited for the first
	conflictsInFlight           // not a flaw: a duplicate in flight gets 409 with Retry-After
	conflictsNoRetry            // a duplicate in flight gets 409 without Retry-After
	failsFirstRequest           // not a flaw: the very first payment fails with 503, kept nowhere
	keepsFirst5xx               // the very first payment fails with 503, which its key keeps and replays
	keeps5xxEveryKey            // every key's first attempt fails with 500, which the key keeps and replays
	leaksAcrossCredentials      // keys are not scoped by credential: another tenant gets the replay
	replaysToRevoked            // looks a replay up before it checks the credential
	neverExpires                // keeps keys past the TTL it was given
	runsTwiceWhenBusy           // once busy, a key's first duplicate that arrives in flight runs again
	effectTwiceWhenBusy         // the same, but it answers the first execution's answer: only a count shows it
)

// busyAfter is how many keys the twice-when-busy fakes see before they
// are busy: more than every check but the history uses, fewer than the
// history's, so that only the history meets the flaw.
const busyAfter = 40

// Credentials the fake accepts; any other gets 401.
const (
	tokenMain      = "Bearer s3cret-token"
	tokenOther     = "Bearer other-token"
	tokenRevocable = "Bearer revocable-token"
)

// fakeAPI is a small idempotent endpoint at /pay, written by hand, with at
// most one flaw. GET /count answers how many payments ran. It honours
// Idem-Fault: fail-before-commit (503, no effect) and hold, which holds a
// key's first execution until another request under the key has met it in
// flight (holdHeader): that check 8's duplicate arrives in flight is
// certain, however late a loaded machine sends it.
type fakeAPI struct {
	flaw     flaw
	requests atomic.Int64 // every request, /count included
	// ttl, when set, is how long a completed key is kept; refuseExpired
	// answers 409 to an expired key instead of running it anew.
	ttl           time.Duration
	refuseExpired bool
	// failKey, when set, makes the first request with that key fail with
	// 503, which the key keeps when failKept.
	failKey  string
	failKept bool
	// concurrentKeys are keys (as the probe sends them) whose requests
	// come at once, check 1's: under noAtomicClaim, the first execution of
	// one waits until a second has arrived, so that the two certainly
	// overlap.
	concurrentKeys []string

	mu       sync.Mutex
	payments int
	keys     map[string]*fakeRecord
	pairs    map[string]*pairing
	revoked  map[string]bool
	attempts int  // payments with a key, for the first-request flaws
	failed   bool // failKey has failed
}

type fakeRecord struct {
	body   string
	done   chan struct{} // closed when the first execution ends
	status int           // 0 while in flight, or when released
	header http.Header
	resp   []byte
	doneAt time.Time

	// held, for a request with holdHeader and, for the twice-when-busy
	// flaws once busy, for every first execution, holds the execution
	// until another request under the key has met it in flight (waits for
	// it, is refused as in flight, or carries another body): that a
	// duplicate meets it in flight is certain, not a matter of timing.
	// release closes it; struck says a waiter has run again.
	held    chan struct{}
	release sync.Once
	struck  bool
	// busy marks a first execution of a twice-when-busy flaw once busy:
	// the first duplicate that meets it in flight runs again.
	busy bool
}

// pairing makes the first two executions of one key meet, so that a flawed
// check-then-run endpoint really runs concurrent duplicates twice.
type pairing struct {
	met  chan struct{}
	once sync.Once
}

func newFakeAPI(t *testing.T, f flaw) (*fakeAPI, *httptest.Server) {
	api := &fakeAPI{flaw: f, keys: map[string]*fakeRecord{}, pairs: map[string]*pairing{}, revoked: map[string]bool{}}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return api, srv
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	if r.Method == http.MethodGet && r.URL.Path == "/count" {
		f.mu.Lock()
		n := f.payments
		f.mu.Unlock()
		fmt.Fprint(w, n)
		return
	}
	auth := r.Header.Get("Authorization")
	if auth != tokenMain && auth != tokenOther && auth != tokenRevocable {
		http.Error(w, `{"error":"unknown credential"}`, http.StatusUnauthorized)
		return
	}
	if r.URL.Path == "/revoke" {
		f.mu.Lock()
		f.revoked[auth] = true
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 || strings.ContainsFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		http.Error(w, `{"error":"bad key"}`, http.StatusBadRequest)
		return
	}
	// Keys are scoped by credential, as a tenant's are.
	scoped := auth + " " + key
	if f.flaw == leaksAcrossCredentials {
		scoped = key
	}
	f.mu.Lock()
	revoked := f.revoked[auth]
	rec := f.keys[scoped]
	f.mu.Unlock()
	if revoked && !(f.flaw == replaysToRevoked && rec != nil) {
		http.Error(w, `{"error":"revoked credential"}`, http.StatusUnauthorized)
		return
	}
	key = scoped
	hold := r.Header.Get("Idem-Fault") == "hold"
	switch f.flaw {
	case noReplay:
		// Every request runs: a held one once another has arrived.
		f.meet(r.Context(), key, hold)
		f.execute(w, r, body)
		return
	case noAtomicClaim:
		f.mu.Lock()
		rec := f.keys[key]
		f.mu.Unlock()
		switch {
		case rec != nil && rec.body != string(body):
			http.Error(w, `{"error":"key reused"}`, http.StatusUnprocessableEntity)
			return
		case rec != nil:
			f.replay(w, rec)
			return
		}
		concurrent := slices.ContainsFunc(f.concurrentKeys, func(k string) bool { return strings.HasSuffix(key, " "+k) })
		f.meet(r.Context(), key, hold || concurrent)
		rec = &fakeRecord{body: string(body)}
		rec.status, rec.header, rec.resp = f.record(w, r, body)
		if rec.status < 500 {
			f.mu.Lock()
			f.keys[key] = rec
			f.mu.Unlock()
		}
		return
	}
	for {
		f.mu.Lock()
		rec := f.keys[key]
		if rec != nil && f.ttl > 0 && f.flaw != neverExpires && rec.status != 0 && time.Since(rec.doneAt) > f.ttl {
			if f.refuseExpired {
				f.mu.Unlock()
				http.Error(w, `{"error":"key expired"}`, http.StatusConflict)
				return
			}
			delete(f.keys, key)
			rec = nil
		}
		if rec == nil {
			rec = &fakeRecord{body: string(body), done: make(chan struct{})}
			f.keys[key] = rec
			f.attempts++
			rec.busy = (f.flaw == runsTwiceWhenBusy || f.flaw == effectTwiceWhenBusy) && f.attempts > busyAfter
			if hold || rec.busy {
				rec.held = make(chan struct{})
			}
			fail := 0
			switch {
			case f.flaw == keeps5xxEveryKey:
				fail = http.StatusInternalServerError
			case (f.flaw == failsFirstRequest || f.flaw == keepsFirst5xx) && f.attempts == 1:
				fail = http.StatusServiceUnavailable
			case f.failKey != "" && strings.HasSuffix(key, " "+f.failKey) && !f.failed:
				fail, f.failed = http.StatusServiceUnavailable, true
			}
			f.mu.Unlock()
			if rec.held != nil {
				select {
				case <-rec.held:
				case <-r.Context().Done():
				}
			}
			var status int
			var header http.Header
			var resp []byte
			if fail != 0 {
				status, header, resp = fail, http.Header{"Content-Type": {"application/json"}}, []byte(`{"error":"internal"}`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(fail)
				w.Write(resp)
			} else {
				status, header, resp = f.record(w, r, body)
			}
			f.mu.Lock()
			if status >= 500 && f.flaw != keeps5xx && f.flaw != keepsFirst5xx && f.flaw != keeps5xxEveryKey && !(fail != 0 && f.failKept) {
				delete(f.keys, key)
			} else {
				rec.status, rec.header, rec.resp, rec.doneAt = status, header, resp, time.Now()
			}
			close(rec.done)
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		if rec.body != string(body) && f.flaw != noMismatchCheck {
			rec.releaseHeld()
			http.Error(w, `{"error":"key reused"}`, http.StatusUnprocessableEntity)
			return
		}
		waited := false
		select {
		case <-rec.done:
		default:
			switch f.flaw {
			case conflictsInFlight:
				w.Header().Set("Retry-After", "1")
				fallthrough
			case conflictsNoRetry:
				// Refused while the first is in flight (held, if it is),
				// which may then end.
				http.Error(w, `{"error":"in flight"}`, http.StatusConflict)
				rec.releaseHeld()
				return
			}
			if rec.busy {
				// This request waits for the held execution, which cannot
				// end before it is released: a duplicate in flight.
				f.mu.Lock()
				again := !rec.struck
				rec.struck = true
				f.mu.Unlock()
				rec.releaseHeld()
				switch {
				case again && f.flaw == runsTwiceWhenBusy:
					f.execute(w, r, body)
					return
				case again:
					f.execute(httptest.NewRecorder(), r, body) // its answer is dropped
				}
			}
			// Known to wait (waited is set before the first may end), the
			// duplicate lets a held first execution go on.
			rec.releaseHeld()
			waited = true
			<-rec.done
		}
		f.mu.Lock()
		kept := f.keys[key] == rec
		f.mu.Unlock()
		if kept {
			if waited && f.flaw == cookiesToWaiters {
				w.Header().Set("Set-Cookie", rec.header.Get("Set-Cookie"))
			}
			f.replay(w, rec)
			return
		}
		// Released after a failure: this request claims it again.
	}
}

// releaseHeld lets a held first execution run.
func (rec *fakeRecord) releaseHeld() {
	if rec.held != nil {
		rec.release.Do(func() { close(rec.held) })
	}
}

// meet pairs the first two requests of key that reach it: with wait, the
// first waits until the second has arrived (or its client has gone), so
// that a flawed endpoint certainly runs both at once; without, it goes on,
// but a second request still pairs with a first that waits.
func (f *fakeAPI) meet(ctx context.Context, key string, wait bool) {
	f.mu.Lock()
	p := f.pairs[key]
	if p != nil {
		f.mu.Unlock()
		p.once.Do(func() { close(p.met) })
		return
	}
	if !wait {
		f.mu.Unlock()
		return
	}
	p = &pairing{met: make(chan struct{})}
	f.pairs[key] = p
	f.mu.Unlock()
	select {
	case <-p.met:
	case <-ctx.Done():
	}
}

// record executes and returns what it answered, as the middleware keeps it.
func (f *fakeAPI) record(w http.ResponseWriter, r *http.Request, body []byte) (int, http.Header, []byte) {
	rec := httptest.NewRecorder()
	f.execute(rec, r, body)
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
	return rec.Code, rec.Header().Clone(), rec.Body.Bytes()
}

func (f *fakeAPI) execute(w http.ResponseWriter, r *http.Request, body []byte) {
	fault := r.Header.Get("Idem-Fault")
	if d, ok := strings.CutPrefix(fault, "delay="); ok {
		dur, _ := time.ParseDuration(d)
		select {
		case <-time.After(dur): // the delay the client asked for
		case <-r.Context().Done():
			return
		}
	}
	if fault == "fail-before-commit" {
		http.Error(w, `{"error":"injected"}`, http.StatusServiceUnavailable)
		return
	}
	f.mu.Lock()
	f.payments++
	id := "pay_" + strconv.Itoa(f.payments)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/pay/"+id)
	w.Header().Set("Set-Cookie", "session=s3cret-session; HttpOnly")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"request":%s}`, id, body)
}

func (f *fakeAPI) replay(w http.ResponseWriter, rec *fakeRecord) {
	for _, h := range []string{"Content-Type", "Location"} {
		w.Header().Set(h, rec.header.Get(h))
	}
	if f.flaw == replaysCookies {
		w.Header().Set("Set-Cookie", rec.header.Get("Set-Cookie"))
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.WriteHeader(rec.status)
	w.Write(rec.resp)
}

func fakeConfig(srv *httptest.Server) *idemprobe.Config {
	return &idemprobe.Config{
		URL:         srv.URL + "/pay",
		Body:        `{"amount":{{n}}}`,
		Header:      http.Header{"Authorization": {"Bearer s3cret-token"}},
		CountURL:    srv.URL + "/count",
		FaultHeader: "Idem-Fault: fail-before-commit",
		SlowHeader:  "Idem-Fault: hold",
		Timeout:     30 * time.Second,
	}
}

// verdicts maps each check's name to its status.
func verdicts(rep *idemprobe.Report) map[string]idemprobe.Status {
	m := map[string]idemprobe.Status{}
	for _, c := range rep.Checks {
		m[c.Name] = c.Status
	}
	return m
}

func notPassing(rep *idemprobe.Report) []string {
	var names []string
	for _, c := range rep.Checks {
		if c.Status == idemprobe.Fail || c.Status == idemprobe.Error {
			names = append(names, c.Name)
		}
	}
	return names
}

func text(t *testing.T, rep *idemprobe.Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// optional are the checks that need a flag fakeConfig does not give.
var optional = map[string]bool{"scope-isolation": true, "revoked-credential": true, "key-expiry": true, "history-linearizable": true}

func TestCorrectEndpointPassesEveryCheck(t *testing.T) {
	t.Parallel()
	for _, counted := range []bool{true, false} {
		t.Run(fmt.Sprintf("count=%v", counted), func(t *testing.T) {
			t.Parallel()
			api, srv := newFakeAPI(t, correct)
			cfg := fakeConfig(srv)
			if !counted {
				cfg.CountURL = ""
			}
			rep, err := idemprobe.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			out := text(t, rep)
			if !rep.OK() || len(rep.Checks) != 13 {
				t.Fatalf("report not OK or not 13 checks:\n%s", out)
			}
			for name, s := range verdicts(rep) {
				if optional[name] {
					if s != idemprobe.NotApplicable {
						t.Errorf("check %s: %s, want n/a without its flag", name, s)
					}
					continue
				}
				if s != idemprobe.Pass {
					t.Errorf("check %s: %s, want pass:\n%s", name, s, out)
				}
			}
			if int64(rep.Requests) != api.requests.Load() {
				t.Errorf("report counts %d requests, the server saw %d", rep.Requests, api.requests.Load())
			}
		})
	}
}

func TestEachFlawFailsItsCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		flaw flaw
		fail []string
	}{
		{"no atomic claim", noAtomicClaim, []string{"concurrent-duplicates", "in-flight-duplicate"}},
		{"mismatch not checked", noMismatchCheck, []string{"key-reuse-refused"}},
		{"credentials replayed", replaysCookies, []string{"no-credentials-replayed"}},
		{"5xx kept", keeps5xx, []string{"5xx-not-kept"}},
		{"credentials replayed to waiting duplicates", cookiesToWaiters, []string{"no-credentials-replayed"}},
		{"409 without Retry-After", conflictsNoRetry, []string{"in-flight-duplicate"}},
		{"409 with Retry-After", conflictsInFlight, nil},
		{"no replay at all", noReplay, []string{"concurrent-duplicates", "sequential-replay", "key-reuse-refused", "lost-response", "in-flight-duplicate"}},
	} {
		// Late: duplicates reach the endpoint well after the probe sent
		// them, as on a loaded machine: a duplicate sent while its key is
		// in flight arrives 350ms later, and check 8's leaves only after a
		// head start of 400ms. The fakes hold what must still be in flight
		// when a duplicate comes, rather than count on it arriving soon, so
		// the verdicts are the same.
		for _, late := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/late=%v", tc.name, late), func(t *testing.T) {
				t.Parallel()
				api, srv := newFakeAPI(t, tc.flaw)
				// Keys from a counter: check 1's is key-2 (see
				// TestFiveHundredMetLater).
				api.concurrentKeys = []string{"key-2"}
				if late {
					srv = httptest.NewServer(lateDuplicates(api))
					t.Cleanup(srv.Close)
				}
				cfg := fakeConfig(srv)
				var keys atomic.Int64
				cfg.NewKey = func() string { return fmt.Sprintf("key-%d", keys.Add(1)) }
				if late {
					cfg.HeadStart = 400 * time.Millisecond
				}
				rep, err := idemprobe.Run(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				out := text(t, rep)
				if got := notPassing(rep); !slices.Equal(got, tc.fail) {
					t.Errorf("checks not passing = %v, want %v:\n%s", got, tc.fail, out)
				}
				if rep.OK() != (len(tc.fail) == 0) {
					t.Errorf("report OK = %v, with %d checks failing", rep.OK(), len(tc.fail))
				}
				for _, name := range tc.fail {
					if !strings.Contains(out, "("+name+")") {
						t.Errorf("the evidence does not name %s:\n%s", name, out)
					}
				}
			})
		}
	}
}

// lateDuplicates hands a request to api only 350ms after it arrived when
// another request under its key is being handled: a duplicate in flight
// that a loaded machine delivers late.
func lateDuplicates(api *fakeAPI) http.Handler {
	var mu sync.Mutex
	inFlight := map[string]int{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		dup := key != "" && inFlight[key] > 0
		inFlight[key]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			inFlight[key]--
			mu.Unlock()
		}()
		if dup {
			timer := time.NewTimer(350 * time.Millisecond) // the lateness simulated, not a wait for anything
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			}
		}
		api.ServeHTTP(w, r)
	})
}

func TestNeverShowsCredentials(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, replaysCookies)
	cfg := fakeConfig(srv)
	cfg.Header.Set("X-Api-Key", "s3cret-api-key")
	cfg.Header.Set("Cookie", "session=s3cret-cookie")
	cfg.SecretHeaders = []string{"x-api-key"}
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	// Every exchange of the JSON report, for the text one shows failures only.
	for _, out := range []string{text(t, rep), js.String()} {
		if strings.Contains(out, "s3cret") {
			t.Errorf("the report shows a secret:\n%s", out)
		}
	}
	if !strings.Contains(js.String(), "Bearer xxxxx") || !strings.Contains(js.String(), "session=xxxxx") {
		t.Errorf("the JSON report lacks the redacted credentials:\n%s", js.String())
	}
}

func TestRefusesRemoteTargets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, count string }{
		{"http://192.0.2.1/pay", ""},          // TEST-NET-1: never a loopback
		{"http://[2001:db8::1]:8080/pay", ""}, // documentation range
		{"http://127.0.0.1:1/pay", "http://192.0.2.1/count"},
	} {
		_, err := idemprobe.Run(t.Context(), &idemprobe.Config{URL: tc.url, CountURL: tc.count})
		if !errors.Is(err, idemprobe.ErrRemote) {
			t.Errorf("Run(%s, count %q) = %v, want ErrRemote", tc.url, tc.count, err)
		}
	}
	_, err := idemprobe.Run(t.Context(), &idemprobe.Config{URL: "http://127.0.0.1:1/pay",
		RevocableHeader: "Authorization: Bearer x", Revoke: "POST http://192.0.2.1/revoke"})
	if !errors.Is(err, idemprobe.ErrRemote) {
		t.Errorf("Run with a remote revoke URL = %v, want ErrRemote", err)
	}
}

func TestRespectsMaxRequests(t *testing.T) {
	t.Parallel()
	for _, max := range []int{3, 12, 25} {
		api, srv := newFakeAPI(t, correct)
		cfg := fakeConfig(srv)
		cfg.MaxRequests = max
		rep, err := idemprobe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("max %d: %v", max, err)
		}
		if got := api.requests.Load(); got > int64(max) {
			t.Errorf("max %d: the server saw %d requests", max, got)
		}
		if rep.OK() {
			t.Errorf("max %d: report OK though checks could not run:\n%s", max, text(t, rep))
		}
		if out := text(t, rep); !strings.Contains(out, "budget") {
			t.Errorf("max %d: the report does not say the budget ran out:\n%s", max, out)
		}
	}
}

// An endpoint that accepts none of the probe's requests gets a report, not
// an error: the baseline's attempts as evidence, every other check not run.
func TestBaselineRefusedIsReportedNotRun(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		http.Error(w, "send an API key", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	out := text(t, rep)
	if rep.Outcome() != idemprobe.OutcomeNotRun || !strings.Contains(out, "COULD NOT RUN") {
		t.Errorf("outcome %s, want not run:\n%s", rep.Outcome(), out)
	}
	for _, c := range rep.Checks {
		switch {
		case c.Name == "sequential-replay":
			if c.Status != idemprobe.Error || !strings.Contains(c.Reason, "401") || len(c.Evidence) != 3 {
				t.Errorf("baseline: %s %q with %d exchanges, want an error naming 401 with its 3 attempts", c.Status, c.Reason, len(c.Evidence))
			}
		case c.Status != idemprobe.NotRun:
			t.Errorf("check %s: %s, want not run", c.Name, c.Status)
		}
	}
	// The first attempt, its retry with the same key, a fresh key: no more.
	if n := requests.Load(); n != 3 {
		t.Errorf("the server saw %d requests, want 3", n)
	}
}

// A server that answers 500 to every key's first attempt and keeps it: the
// probe cannot run the checks that need a success, but names the bug.
func TestEveryFirstAttemptFailsAndIsKept(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, keeps5xxEveryKey)
	cfg := fakeConfig(srv)
	cfg.FaultHeader = "" // no fault header: the bug is met on the way
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := text(t, rep)
	v := verdicts(rep)
	if v["5xx-not-kept"] != idemprobe.Fail || v["sequential-replay"] != idemprobe.Error || v["concurrent-duplicates"] != idemprobe.NotRun {
		t.Errorf("5xx-not-kept %s, sequential-replay %s, concurrent-duplicates %s; want fail, error, not run:\n%s",
			v["5xx-not-kept"], v["sequential-replay"], v["concurrent-duplicates"], out)
	}
	if rep.Outcome() != idemprobe.OutcomeFail || !strings.Contains(out, "a transient failure was kept") {
		t.Errorf("outcome %s, want fail naming the kept failure:\n%s", rep.Outcome(), out)
	}
}

// Without a fault header, a 5xx met by the baseline is judged by the
// retry the probe sends with its key; the probe then goes on.
func TestFiveHundredMetOnTheWay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flaw flaw
		want idemprobe.Status
	}{
		{failsFirstRequest, idemprobe.Pass},
		{keepsFirst5xx, idemprobe.Fail},
	} {
		_, srv := newFakeAPI(t, tc.flaw)
		cfg := fakeConfig(srv)
		cfg.FaultHeader = ""
		rep, err := idemprobe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		out := text(t, rep)
		for _, c := range rep.Checks {
			want := idemprobe.Pass
			if optional[c.Name] {
				want = idemprobe.NotApplicable
			}
			if c.Name == "5xx-not-kept" {
				want = tc.want
				if !strings.Contains(c.Reason, "met on the way") {
					t.Errorf("flaw %d: check 7 says %q, want it met on the way", tc.flaw, c.Reason)
				}
			}
			if c.Status != want {
				t.Errorf("flaw %d: check %s: %s, want %s:\n%s", tc.flaw, c.Name, c.Status, want, out)
			}
		}
	}
}

// A 5xx met by any check, not only the baseline, is judged by check 7,
// which retries its key once the other checks are done.
func TestFiveHundredMetLater(t *testing.T) {
	t.Parallel()
	for _, kept := range []bool{false, true} {
		api, srv := newFakeAPI(t, correct)
		// Keys come from a counter: the baseline's is key-1, check 1's
		// key-2, the malformed one's key-3, check 5's key-4, check 8's key-5.
		api.failKey, api.failKept = "key-5", kept
		cfg := fakeConfig(srv)
		cfg.FaultHeader = ""
		var keys atomic.Int64
		cfg.NewKey = func() string { return fmt.Sprintf("key-%d", keys.Add(1)) }
		rep, err := idemprobe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]idemprobe.Status{false: idemprobe.Pass, true: idemprobe.Fail}[kept]
		for _, c := range rep.Checks {
			if c.Name == "5xx-not-kept" && (c.Status != want || !strings.Contains(c.Reason, "met on the way")) {
				t.Errorf("kept %v: check 7 %s %q, want %s met on the way:\n%s", kept, c.Status, c.Reason, want, text(t, rep))
			}
		}
	}
}

func TestScopeIsolation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flaw flaw
		want idemprobe.Status
	}{{correct, idemprobe.Pass}, {leaksAcrossCredentials, idemprobe.Fail}} {
		_, srv := newFakeAPI(t, tc.flaw)
		cfg := fakeConfig(srv)
		cfg.OtherHeader = "Authorization: " + tokenOther
		rep, err := idemprobe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := verdicts(rep)["scope-isolation"]; got != tc.want {
			t.Errorf("flaw %d: scope-isolation %s, want %s:\n%s", tc.flaw, got, tc.want, text(t, rep))
		}
		if strings.Contains(text(t, rep), "other-token") {
			t.Errorf("the report shows the other credential")
		}
	}
}

func TestRevokedCredential(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flaw flaw
		want idemprobe.Status
	}{{correct, idemprobe.Pass}, {replaysToRevoked, idemprobe.Fail}} {
		_, srv := newFakeAPI(t, tc.flaw)
		cfg := fakeConfig(srv)
		cfg.RevocableHeader = "Authorization: " + tokenRevocable
		cfg.Revoke = "POST " + srv.URL + "/revoke"
		rep, err := idemprobe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := verdicts(rep)["revoked-credential"]; got != tc.want {
			t.Errorf("flaw %d: revoked-credential %s, want %s:\n%s", tc.flaw, got, tc.want, text(t, rep))
		}
	}
	// A revoke request that revokes nothing is the probe's problem to say.
	_, srv := newFakeAPI(t, correct)
	cfg := fakeConfig(srv)
	cfg.RevocableHeader = "Authorization: " + tokenRevocable
	cfg.Revoke = "GET " + srv.URL + "/count"
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "revoked-credential" && (c.Status != idemprobe.Error || !strings.Contains(c.Reason, "did not take")) {
			t.Errorf("revoke that does nothing: %s %q, want an error saying the revocation did not take", c.Status, c.Reason)
		}
	}
}

func TestKeyExpiry(t *testing.T) {
	t.Parallel()
	// The probe's duplicate "at once" must reach the fake within the TTL,
	// so that it is replayed: a TTL of 200 ms could pass in a loaded
	// machine's pause between the first request and the duplicate.
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name    string
		flaw    flaw
		refuse  bool
		want    idemprobe.Status
		because string
	}{
		{"runs anew", correct, false, idemprobe.Pass, "ran anew"},
		{"refused", correct, true, idemprobe.Pass, "is refused (409 Conflict)"},
		{"never expires", neverExpires, false, idemprobe.Fail, "still replayed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api, srv := newFakeAPI(t, tc.flaw)
			api.ttl, api.refuseExpired = ttl, tc.refuse
			cfg := fakeConfig(srv)
			cfg.TTL = ttl
			rep, err := idemprobe.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range rep.Checks {
				if c.Name == "key-expiry" && (c.Status != tc.want || !strings.Contains(c.Reason, tc.because)) {
					t.Errorf("key-expiry: %s %q, want %s saying %q:\n%s", c.Status, c.Reason, tc.want, tc.because, text(t, rep))
				}
			}
		})
	}
}

// A server that, once busy, runs a duplicate that arrives while its key is
// in flight a second time passes every check made a few requests at a time
// (all made before it is busy); only the history finds it, and saves
// Porcupine's view of it. The fakes make the overlap certain rather than
// likely (fakeRecord.held), so that a loaded machine cannot hide the flaw.
func TestHistoryFindsADoubleRunUnderLoad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flaw flaw
		fail []string
	}{
		{correct, nil},
		{runsTwiceWhenBusy, []string{"history-linearizable"}},
		// The other body under a key that ran gets the first answer.
		{noMismatchCheck, []string{"key-reuse-refused", "history-linearizable"}},
		// Answers all linearizable: the count catches the second effect.
		{effectTwiceWhenBusy, []string{"history-linearizable"}},
	} {
		t.Run(fmt.Sprint(tc.flaw), func(t *testing.T) {
			t.Parallel()
			testHistory(t, tc.flaw, tc.fail)
		})
	}
}

// Many requests under one key, a tenth of them hung up: a request whose
// answer is unknown may take effect at any time after it was sent, so a
// search over every order of them explodes once the history goes wrong
// late. A server that, past three quarters of the history, runs the key
// again must still be found out (a failure, not "could not finish"), and
// at once: refusals and unknown answers change nothing in the model, so
// they cannot make a history linearizable or not.
func TestHistoryOneKeyGoingWrongLate(t *testing.T) {
	t.Parallel()
	const history = 120
	for _, wrong := range []bool{false, true} {
		t.Run(fmt.Sprint("wrong=", wrong), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := 0
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen++
				id := "pay_1"
				if wrong && seen > history*3/4 {
					id = "pay_2" // ran again
				}
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":%q}`, id)
			})
			rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{
				Handler: h, URL: "/pay",
				History: history, HistoryKeys: 1, HistorySeed: 3, HistoryDir: t.TempDir(),
			})
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]idemprobe.Status{false: idemprobe.Pass, true: idemprobe.Fail}[wrong]
			for _, c := range rep.Checks {
				if c.Name == "history-linearizable" && c.Status != want {
					t.Errorf("history-linearizable: %s %q, want %s", c.Status, c.Reason, want)
				}
			}
		})
	}
}

// testHistory probes a fake with flaw, a history included, and wants the
// checks in fail, and only those, not to pass.
func testHistory(t *testing.T, f flaw, fail []string) {
	_, srv := newFakeAPI(t, f)
	cfg := fakeConfig(srv)
	// Eight requests a key, as many as clients, under 75 keys: once the
	// twice-when-busy fakes are busy (past their first 40 keys, the checks
	// before the history using some 10) they strike on some 45 keys, so
	// that the flaw shows not only on requests whose clients hang up
	// (whose answers no one sees, and whose effects may land after the
	// last count): with the seed fixed, more than 20 of those keys carry no
	// mismatched body, and there a strike is certain.
	cfg.History, cfg.HistoryKeys, cfg.HistoryClients, cfg.HistorySeed = 600, 75, 8, 30
	cfg.HistoryDir = t.TempDir()
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := text(t, rep)
	if got := notPassing(rep); !slices.Equal(got, fail) {
		t.Errorf("checks not passing = %v, want %v:\n%s", got, fail, out)
	}
	for _, c := range rep.Checks {
		if c.Name != "history-linearizable" {
			continue
		}
		switch {
		case f == effectTwiceWhenBusy:
			if c.Artifact != "" || !strings.Contains(c.Reason, "linearizable by the answers, but the effect grew") {
				t.Errorf("history of a server that doubles an effect: %q, artifact %q", c.Reason, c.Artifact)
			}
		case fail == nil:
			if c.Artifact != "" || !strings.Contains(c.Reason, "linearizable") {
				t.Errorf("history of a correct server: %q, artifact %q", c.Reason, c.Artifact)
			}
		default:
			html, err := os.ReadFile(c.Artifact)
			if err != nil || !bytes.Contains(html, []byte("<html")) || !strings.Contains(out, c.Artifact) {
				t.Errorf("visualisation %q (%v) not saved as HTML or not named in the report:\n%s", c.Artifact, err, out)
			}
		}
	}
}

func TestJUnitReport(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, keeps5xx)
	cfg := fakeConfig(srv)
	cfg.SlowHeader = "X-Ignored: 1" // check 8 cannot finish: an <error>
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteJUnit(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Errors   int `xml:"errors,attr"`
			Skipped  int `xml:"skipped,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if len(got.Suites) != 1 {
		t.Fatalf("%d suites, want 1", len(got.Suites))
	}
	s := got.Suites[0]
	if s.Tests != len(rep.Checks) || len(s.Cases) != len(rep.Checks) || s.Failures != 1 || s.Errors != 1 || s.Skipped != 4 {
		t.Errorf("tests %d (%d cases), failures %d, errors %d, skipped %d; want %d, 1, 1, 4:\n%s",
			s.Tests, len(s.Cases), s.Failures, s.Errors, s.Skipped, len(rep.Checks), b.String())
	}
	for i, c := range s.Cases {
		want := map[idemprobe.Status]string{idemprobe.Fail: "failure", idemprobe.Error: "error", idemprobe.NotApplicable: "skipped", idemprobe.Pass: ""}[rep.Checks[i].Status]
		gotKind := ""
		switch {
		case c.Failure != nil:
			gotKind = "failure"
		case c.Error != nil:
			gotKind = "error"
		case c.Skipped != nil:
			gotKind = "skipped"
		}
		if gotKind != want || !strings.Contains(c.Name, rep.Checks[i].Name) {
			t.Errorf("case %q: %q, want %q", c.Name, gotKind, want)
		}
	}
}

func TestEndpointWithoutRequiredKeys(t *testing.T) {
	t.Parallel()
	// Keys optional: a request without one runs, unprotected.
	api, srv := newFakeAPI(t, correct)
	optional := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "" && r.Method == http.MethodPost {
			api.execute(w, r, nil)
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(optional.Close)
	cfg := fakeConfig(srv)
	cfg.URL = optional.URL + "/pay"
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "missing-key-refused" && (c.Status != idemprobe.NotApplicable || !strings.Contains(c.Reason, "does not require keys")) {
			t.Errorf("missing key check: %s %q, want n/a saying keys are not required", c.Status, c.Reason)
		}
	}
	if !rep.OK() {
		t.Errorf("report not OK:\n%s", text(t, rep))
	}
}

func TestJSONReport(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, keeps5xx)
	rep, err := idemprobe.Run(t.Context(), fakeConfig(srv))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Outcome string
		Checks  []struct {
			Number   int
			Name     string
			Source   string
			Status   string
			Evidence []json.RawMessage
		}
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Outcome != "fail" {
		t.Errorf("outcome %q, want fail", got.Outcome)
	}
	wantNumbers := []int{1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	if len(got.Checks) != len(wantNumbers) {
		t.Fatalf("%d checks, want %d", len(got.Checks), len(wantNumbers))
	}
	for i, c := range got.Checks {
		if c.Number != wantNumbers[i] || c.Name == "" || c.Source == "" {
			t.Errorf("check %d: %+v", i, c)
		}
		if c.Name == "5xx-not-kept" && (c.Status != "fail" || len(c.Evidence) == 0) {
			t.Errorf("5xx check: status %s with %d exchanges, want fail with evidence", c.Status, len(c.Evidence))
		}
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []idemprobe.Config{
		{URL: ""},
		{URL: "ftp://127.0.0.1/x"},
		{URL: "http://127.0.0.1/x", Concurrency: 1},
		{URL: "http://127.0.0.1/x", MaxRequests: -1},
		{URL: "http://127.0.0.1/x", FaultHeader: "no colon"},
		{URL: "http://127.0.0.1/x", TTL: time.Minute},
		{URL: "http://127.0.0.1/x", History: -1},
		{URL: "http://127.0.0.1/x", Revoke: "POST http://127.0.0.1/revoke"},
		{URL: "http://127.0.0.1/x", RevocableHeader: "Authorization: Bearer x", Revoke: "http://127.0.0.1/revoke"},
		{URL: "http://127.0.0.1/x", OtherHeader: "no colon"},
	} {
		if _, err := idemprobe.Run(t.Context(), &cfg); !errors.Is(err, idemprobe.ErrInvalidConfig) {
			t.Errorf("Run(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := idemprobe.Run(t.Context(), nil); !errors.Is(err, idemprobe.ErrInvalidConfig) {
		t.Errorf("Run(nil) = %v, want ErrInvalidConfig", err)
	}
}

func TestSlowHeaderThatDoesNotSlow(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t, correct)
	cfg := fakeConfig(srv)
	cfg.SlowHeader = "X-Ignored: 1"
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "in-flight-duplicate" && (c.Status != idemprobe.Error || !strings.Contains(c.Reason, "did not hold it")) {
			t.Errorf("in-flight check: %s %q, want an error saying the request was not held", c.Status, c.Reason)
		}
	}
	if rep.OK() {
		t.Error("report OK though check 8 could not run")
	}
}

func TestTimeoutBoundsTheProbe(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers
	}))
	t.Cleanup(srv.Close)
	start := time.Now()
	rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{URL: srv.URL, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome() != idemprobe.OutcomeNotRun || !strings.Contains(text(t, rep), "timeout") {
		t.Errorf("Run against a server that never answers: %s, want not run naming the timeout:\n%s", rep.Outcome(), text(t, rep))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Run took %s with a timeout of 200ms", d)
	}
}
