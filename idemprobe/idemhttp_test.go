package idemprobe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprobe"
	"github.com/idem-go/idem/keyed"
)

// paymentsAPI is an endpoint as an API team builds one: POST /pay behind
// idemhttp on idemmem, keys scoped by the credential, an authentication
// layer in front that refuses unknown and revoked credentials, GET /count
// and POST /revoke beside it. The payment honours Idem-Fault:
// fail-before-commit (503, no effect), as idem serve --faults does, and
// hold, which holds the payment until a duplicate has met its key in
// flight (meetings). With unsafe, POST /pay runs every request, keys or
// not, as idem serve --unsafe-no-idempotency does.
type paymentsAPI struct {
	mu       sync.Mutex
	payments int
	revoked  map[string]bool
	meetings *meetings
}

func newPaymentsAPI(t *testing.T, unsafe bool, adjust func(*idemhttp.Config)) http.Handler {
	t.Helper()
	api := &paymentsAPI{revoked: map[string]bool{}, meetings: newMeetings()}
	cfg := &idemhttp.Config{
		Store:    idemmem.NewStore(nil),
		Scope:    func(r *http.Request) (idem.Scope, error) { return idem.Scope(r.Header.Get("Authorization")), nil },
		Observer: api.meetings,
	}
	if adjust != nil {
		adjust(cfg)
	}
	keys, err := idemhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pay := http.Handler(http.HandlerFunc(api.pay))
	if !unsafe {
		pay = keys.Handler(pay)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /pay", pay)
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, _ *http.Request) {
		api.mu.Lock()
		defer api.mu.Unlock()
		fmt.Fprint(w, api.payments)
	})
	mux.HandleFunc("POST /revoke", func(w http.ResponseWriter, r *http.Request) {
		api.mu.Lock()
		api.revoked[r.Header.Get("Authorization")] = true
		api.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		api.mu.Lock()
		revoked := api.revoked[auth]
		api.mu.Unlock()
		if (auth != tokenMain && auth != tokenOther && auth != tokenRevocable) || revoked {
			http.Error(w, `{"error":"unknown or revoked credential"}`, http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (api *paymentsAPI) pay(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "unreadable body", http.StatusBadRequest)
		return
	}
	fault := r.Header.Get("Idem-Fault")
	if fault == "hold" {
		api.meetings.hold(r)
	} else {
		// Unprotected (unsafe), a duplicate runs here, beside the one held.
		api.meetings.met(idem.Key(r.Header.Get("Idempotency-Key")))
	}
	if fault == "fail-before-commit" {
		http.Error(w, `{"error":"injected"}`, http.StatusServiceUnavailable)
		return
	}
	api.mu.Lock()
	api.payments++
	id := fmt.Sprintf("pay_%d", api.payments)
	api.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/pay/"+id)
	// A session cookie, which a replay must never hand on.
	w.Header().Set("Set-Cookie", "session=s3cret-session; HttpOnly")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"request":%s}`, id, body)
}

// paymentsConfig probes h with every option but TTL, and the draft's cases.
func paymentsConfig(h http.Handler) *idemprobe.Config {
	return &idemprobe.Config{
		Handler:     h,
		URL:         "/pay",
		Body:        `{"amount":{{n}}}`,
		Header:      http.Header{"Authorization": {tokenMain}},
		CountURL:    "/count",
		FaultHeader: "Idem-Fault: fail-before-commit",
		// Held until its duplicate has met it in flight, however late a
		// loaded machine sends that.
		SlowHeader:      "Idem-Fault: hold",
		OtherHeader:     "Authorization: " + tokenOther,
		RevocableHeader: "Authorization: " + tokenRevocable,
		Revoke:          "POST /revoke",
		History:         120,
		HistoryKeys:     20,
		HistorySeed:     7,
		Timeout:         30 * time.Second,
		Cases:           idemprobe.DraftCases(),
	}
}

// byStatus lists the checks' names by status, in the report's order.
func byStatus(rep *idemprobe.Report) map[idemprobe.Status][]string {
	m := map[idemprobe.Status][]string{}
	for _, c := range rep.Checks {
		m[c.Status] = append(m[c.Status], c.Name)
	}
	return m
}

func wantStatuses(t *testing.T, rep *idemprobe.Report, want map[idemprobe.Status][]string) {
	t.Helper()
	got := byStatus(rep)
	for _, s := range []idemprobe.Status{idemprobe.Pass, idemprobe.Fail, idemprobe.NotApplicable, idemprobe.Error, idemprobe.NotRun} {
		if !slices.Equal(got[s], want[s]) {
			t.Errorf("%s: %v, want %v", s, got[s], want[s])
		}
	}
	if t.Failed() {
		t.Logf("the report:\n%s", text(t, rep))
	}
}

// Every check and every case of the draft, against idemhttp on idemmem
// served in-process: all pass, but check 11, which needs a TTL.
func TestIdemhttpPassesEveryCheck(t *testing.T) {
	t.Parallel()
	rep, err := idemprobe.Run(t.Context(), paymentsConfig(newPaymentsAPI(t, false, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var pass []string
	for _, c := range rep.Checks {
		if c.Name != "key-expiry" {
			pass = append(pass, c.Name)
		}
	}
	wantStatuses(t, rep, map[idemprobe.Status][]string{idemprobe.Pass: pass, idemprobe.NotApplicable: {"key-expiry"}})
	if n := len(rep.Checks); n != 13+len(idemprobe.DraftCases()) {
		t.Errorf("%d checks, want the 13 and the draft's %d", n, len(idemprobe.DraftCases()))
	}
	if !strings.Contains(text(t, rep), "IETF draft-07 §2.6") {
		t.Errorf("the report does not cite the draft's sections:\n%s", text(t, rep))
	}
}

// Check 11 alone needs the TTL to be waited out: a run of its own, without
// a slow header, since a lease as short as the TTL (idemhttp lowers the
// lease to it) would let a slow request's key be taken over.
func TestIdemhttpKeyExpiry(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	h := newPaymentsAPI(t, false, func(c *idemhttp.Config) { c.TTL = ttl })
	cfg := paymentsConfig(h)
	cfg.SlowHeader, cfg.History, cfg.Cases, cfg.TTL = "", 0, nil, ttl
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "key-expiry" && (c.Status != idemprobe.Pass || !strings.Contains(c.Reason, "ran anew")) {
			t.Errorf("key-expiry: %s %q, want a pass saying the key ran anew", c.Status, c.Reason)
		}
	}
	if !rep.OK() {
		t.Errorf("report not OK:\n%s", text(t, rep))
	}
}

// Handlers that get idempotency wrong, each in the way a team might: each
// fails the checks and cases that its flaw breaks, and no others.
func TestUnsafeHandlersFailTheirChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		unsafe bool
		adjust func(*idemhttp.Config)
		want   map[idemprobe.Status][]string
	}{
		{
			// idem serve --unsafe-no-idempotency: keys are ignored.
			name: "keys ignored", unsafe: true,
			want: map[idemprobe.Status][]string{
				idemprobe.Fail: {"concurrent-duplicates", "sequential-replay", "key-reuse-refused", "malformed-key-refused", "lost-response",
					"in-flight-duplicate", "history-linearizable", "draft-retry-replayed", "draft-concurrent-conflict",
					"draft-payload-mismatch", "draft-corrected-retry", "draft-sf-string-key", "draft-invalid-key"},
				// Nothing is replayed, so no replay carries a cookie; no key is
				// required; a fresh execution is all another tenant gets; and a
				// revoked credential is refused by the layer in front.
				idemprobe.NotApplicable: {"missing-key-refused", "no-credentials-replayed", "key-expiry", "draft-missing-key"},
				idemprobe.Pass:          {"5xx-not-kept", "scope-isolation", "revoked-credential", "draft-scoped-key"},
			},
		},
		{
			// One scope for every caller: another tenant gets the replay.
			name: "shared scope", adjust: func(c *idemhttp.Config) { c.Scope, c.SharedScope = nil, true },
			want: map[idemprobe.Status][]string{
				idemprobe.Fail:          {"scope-isolation", "draft-scoped-key"},
				idemprobe.NotApplicable: {"key-expiry"},
			},
		},
		{
			// Keys optional: a request without one runs, unprotected.
			name: "keys optional", adjust: func(c *idemhttp.Config) { c.Optional = true },
			want: map[idemprobe.Status][]string{
				idemprobe.NotApplicable: {"missing-key-refused", "key-expiry", "draft-missing-key"},
			},
		},
		{
			// Every answer kept, a 503 included.
			name: "5xx kept", adjust: func(c *idemhttp.Config) { c.Keep = func(*http.Request, int) bool { return true } },
			want: map[idemprobe.Status][]string{
				idemprobe.Fail:          {"5xx-not-kept"},
				idemprobe.NotApplicable: {"key-expiry"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rep, err := idemprobe.Run(t.Context(), paymentsConfig(newPaymentsAPI(t, tc.unsafe, tc.adjust)))
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want[idemprobe.Pass] == nil {
				// Every check not named passes.
				named := map[string]bool{}
				for _, names := range want {
					for _, n := range names {
						named[n] = true
					}
				}
				for _, c := range rep.Checks {
					if !named[c.Name] {
						want[idemprobe.Pass] = append(want[idemprobe.Pass], c.Name)
					}
				}
			}
			wantStatuses(t, rep, want)
		})
	}
}

// The draft answers 409 at once to a duplicate in flight; idemhttp waits
// for the first answer, within InflightWait. Strict holds the endpoint to
// the draft's words: idemhttp as it is fails checks 8 and
// draft-concurrent-conflict, and passes them once it waits not at all.
func TestStrictWantsAConflictAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait time.Duration
		fail []string
	}{
		{0, []string{"in-flight-duplicate", "draft-concurrent-conflict"}},
		{-1, nil},
	} {
		t.Run(fmt.Sprint("InflightWait=", tc.wait), func(t *testing.T) {
			t.Parallel()
			cfg := paymentsConfig(newPaymentsAPI(t, false, func(c *idemhttp.Config) { c.InflightWait = tc.wait }))
			cfg.Strict, cfg.History, cfg.RevocableHeader, cfg.Revoke = true, 0, "", ""
			rep, err := idemprobe.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := notPassing(rep); !slices.Equal(got, tc.fail) {
				t.Errorf("checks not passing = %v, want %v:\n%s", got, tc.fail, text(t, rep))
			}
			for _, c := range rep.Checks {
				if slices.Contains(tc.fail, c.Name) && !strings.Contains(c.Reason, "409") {
					t.Errorf("%s: %q does not say a 409 was wanted", c.Name, c.Reason)
				}
			}
		})
	}
}

// A server that marks replays with another header than idem's: given its
// name, the probe reads it; without, it cannot tell a replay from a second
// execution where nothing else tells (no count).
func TestReplayHeaderName(t *testing.T) {
	t.Parallel()
	h := newPaymentsAPI(t, false, nil)
	renamed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&renameReplayed{ResponseWriter: w}, r)
	})
	for _, tc := range []struct {
		header string
		want   idemprobe.Status
		says   string
	}{
		{"Idempotency-Replayed", idemprobe.Pass, "Idempotency-Replayed: true"},
		{"", idemprobe.NotApplicable, "not marked Idempotent-Replayed"},
	} {
		cfg := paymentsConfig(renamed)
		cfg.CountURL, cfg.History, cfg.Cases, cfg.SlowHeader, cfg.ReplayHeader = "", 0, nil, "", tc.header
		rep, err := idemprobe.Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range rep.Checks {
			if c.Name == "lost-response" && (c.Status != tc.want || !strings.Contains(c.Reason, tc.says)) {
				t.Errorf("replay header %q: lost-response %s %q, want %s saying %q", tc.header, c.Status, c.Reason, tc.want, tc.says)
			}
		}
	}
}

// renameReplayed sends idem's Idempotent-Replayed as Idempotency-Replayed.
type renameReplayed struct{ http.ResponseWriter }

func (w *renameReplayed) WriteHeader(status int) {
	h := w.Header()
	if v := h.Get(idemhttp.HeaderReplayed); v != "" {
		h.Del(idemhttp.HeaderReplayed)
		h.Set("Idempotency-Replayed", v)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *renameReplayed) Write(b []byte) (int, error) { return w.ResponseWriter.Write(b) }

func TestHandlerURLsArePaths(t *testing.T) {
	t.Parallel()
	h := newPaymentsAPI(t, false, nil)
	for _, cfg := range []idemprobe.Config{
		{Handler: h, URL: "http://127.0.0.1:8080/pay"},
		{Handler: h, URL: "pay"},
		{Handler: h, URL: "/pay", CountURL: "http://127.0.0.1/count"},
		{Handler: h, URL: "/pay", RevocableHeader: "Authorization: " + tokenRevocable, Revoke: "POST http://127.0.0.1/revoke"},
		{Handler: h, ReplayHeader: "Idempotent Replayed"},
	} {
		if _, err := idemprobe.Run(t.Context(), &cfg); !errors.Is(err, idemprobe.ErrInvalidConfig) {
			t.Errorf("Run(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	// URL defaults to "/", where this handler answers 401 without a
	// credential: the probe ran against it, and could not run its checks.
	rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome() != idemprobe.OutcomeNotRun || !strings.HasSuffix(rep.URL, "/") {
		t.Errorf("outcome %s against %s, want not run against /", rep.Outcome(), rep.URL)
	}
}

// The in-process server ends with the run (and TestMain's leak check sees
// that none of its goroutines is left).
func TestHandlerServerIsClosed(t *testing.T) {
	t.Parallel()
	cfg := paymentsConfig(newPaymentsAPI(t, false, nil))
	cfg.History, cfg.Cases = 0, nil
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rep.URL, "http://127.0.0.1:") {
		t.Errorf("report URL %s, want the loopback server's", rep.URL)
	}
	resp, err := http.Get(strings.TrimSuffix(rep.URL, "/pay") + "/count")
	if err == nil {
		resp.Body.Close()
		t.Errorf("the handler is still served after Run: %s", resp.Status)
	}
}

// A handler that never returns (it ignores its request's context) must
// not keep Run past Config.Timeout: the probe gives up on it, reports the
// request it held as cut short, and returns.
func TestHandlerThatHangsEndsWithTheTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // lets the handler end before the leak check
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})
	type result struct {
		rep *idemprobe.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{Handler: h, SlowHeader: "X-Hang: 1", Timeout: 2 * time.Second})
		done <- result{rep, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		for _, c := range r.rep.Checks {
			if c.Name == "in-flight-duplicate" && (c.Status != idemprobe.Error || !strings.Contains(c.Reason, "timeout")) {
				t.Errorf("in-flight-duplicate: %s %q, want an error saying the timeout ran out", c.Status, c.Reason)
			}
		}
	case <-time.After(30 * time.Second):
		t.Errorf("Run has not returned 30s after it began, with a Timeout of 2s")
	}
}

// meetings holds a request in flight until a duplicate has met its key
// there, so that what the duplicate gets (the first's answer after
// waiting for it, or 409) is the middleware's doing, not the scheduler's.
// It is idemhttp's Observer: a duplicate that finds its key in flight
// claims it again at once, and after that second look either waits for
// the first's answer or, its InflightWait spent, refuses with 409; so a
// request's second claim releases the key's held request. A duplicate that
// reaches the handler (no middleware) releases it too.
type meetings struct {
	mu   sync.Mutex
	keys map[idem.Key]chan struct{}
}

func newMeetings() *meetings { return &meetings{keys: map[idem.Key]chan struct{}{}} }

func (m *meetings) meeting(key idem.Key) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.keys[key]
	if !ok {
		c = make(chan struct{})
		m.keys[key] = c
	}
	return c
}

// hold waits until a duplicate has met r's key in flight, or r's client
// has gone.
func (m *meetings) hold(r *http.Request) {
	select {
	case <-m.meeting(idem.Key(r.Header.Get("Idempotency-Key"))):
	case <-r.Context().Done():
	}
}

// met releases the request held under key, if any.
func (m *meetings) met(key idem.Key) {
	c := m.meeting(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-c:
	default:
		close(c)
	}
}

// claims counts one request's claims of its key; only the request's
// goroutine touches it.
type claims struct {
	key idem.Key
	n   int
}

type claimsKey struct{}

func (m *meetings) Begin(ctx context.Context, e keyed.Event) context.Context {
	switch e.Phase {
	case keyed.PhaseRequest:
		return context.WithValue(ctx, claimsKey{}, &claims{})
	case keyed.PhaseClaim:
		if c, ok := ctx.Value(claimsKey{}).(*claims); ok {
			c.key = e.Key
		}
	}
	return ctx
}

func (m *meetings) End(context.Context, keyed.Event) {}

func (m *meetings) Store(ctx context.Context, op keyed.StoreOp, _ time.Duration, err error) {
	if c, ok := ctx.Value(claimsKey{}).(*claims); ok && op == keyed.StoreClaim && err == nil {
		if c.n++; c.n == 2 {
			m.met(c.key)
		}
	}
}
