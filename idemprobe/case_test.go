package idemprobe_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/idemprobe"
)

// A case that cannot run as written is refused before anything is sent,
// saying what is wrong.
func TestCaseValidation(t *testing.T) {
	t.Parallel()
	ok := idemprobe.Step{Name: "first"}
	for _, tc := range []struct {
		c    idemprobe.Case
		says string
	}{
		{idemprobe.Case{Name: "Has Spaces", Steps: []idemprobe.Step{ok}}, "lowercase"},
		{idemprobe.Case{Name: "no-steps"}, "no steps"},
		{idemprobe.Case{Name: "bad-effect", Steps: []idemprobe.Step{ok}, Effect: -2}, "Effect -2"},
		{idemprobe.Case{Name: "sequential-replay", Steps: []idemprobe.Step{ok}}, `two checks are named "sequential-replay"`},
		{idemprobe.Case{Name: "dup-steps", Steps: []idemprobe.Step{ok, ok}}, `two steps are named "first"`},
		{idemprobe.Case{Name: "later-ref", Steps: []idemprobe.Step{{Want: idemprobe.Want{Same: "second"}}, {Name: "second"}}}, "not an earlier step"},
		{idemprobe.Case{Name: "hangup-ref", Steps: []idemprobe.Step{{Name: "lost", HangUp: true}, {Want: idemprobe.Want{Same: "lost"}}}}, "hangs up and has no answer"},
		{idemprobe.Case{Name: "hangup-want", Steps: []idemprobe.Step{{HangUp: true, Want: idemprobe.Want{Status: []int{201}}}}}, "no answer to want"},
		{idemprobe.Case{Name: "last-background", Steps: []idemprobe.Step{{Background: true}}}, "no next step"},
		{idemprobe.Case{Name: "copies-background", Steps: []idemprobe.Step{{Copies: 3, Background: true}, ok}}, "copies cannot"},
		{idemprobe.Case{Name: "lone-conflict", Steps: []idemprobe.Step{ok, {Want: idemprobe.Want{Conflict: true}}}}, "Conflict needs a duplicate in flight"},
		{idemprobe.Case{Name: "conflict-status", Steps: []idemprobe.Step{{Copies: 2, Want: idemprobe.Want{Conflict: true, Status: []int{409}}}}}, "Conflict decides the status"},
		{idemprobe.Case{Name: "bad-status", Steps: []idemprobe.Step{{Want: idemprobe.Want{Status: []int{42}}}}}, "status 42"},
		{idemprobe.Case{Name: "nokey-rawkey", Steps: []idemprobe.Step{{NoKey: true, RawKey: "k"}}}, "contradict"},
		{idemprobe.Case{Name: "bad-header", Steps: []idemprobe.Step{{Want: idemprobe.Want{Header: []string{"Retry After"}}}}}, "not a header name"},
		// Found before the first step is sent, not when the second is.
		{idemprobe.Case{Name: "bad-step-header", Steps: []idemprobe.Step{ok, {Header: http.Header{"X Trace": {"1"}}}}}, `"X Trace" is not a header name`},
		{idemprobe.Case{Name: "bad-step-value", Steps: []idemprobe.Step{ok, {Header: http.Header{"X-Trace": {"1\r\nX-Evil: 1"}}}}}, "X-Trace"},
		{idemprobe.Case{Name: "bad-method", Steps: []idemprobe.Step{ok, {Method: "GE T"}}}, "method"},
		{idemprobe.Case{Name: "bad-raw-key", Steps: []idemprobe.Step{ok, {RawKey: "k\n{{key}}"}}}, "RawKey"},
		{idemprobe.Case{Name: "too-many-copies", Steps: []idemprobe.Step{ok, {Copies: 201}}}, "Copies 201"},
	} {
		var sent atomic.Int64
		srv := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { sent.Add(1) })
		_, err := idemprobe.Run(t.Context(), &idemprobe.Config{Handler: srv, Cases: []idemprobe.Case{tc.c}})
		if !errors.Is(err, idemprobe.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("case %q: %v, want ErrInvalidConfig saying %q", tc.c.Name, err, tc.says)
		}
		if n := sent.Load(); n != 0 {
			t.Errorf("case %q: %d requests sent", tc.c.Name, n)
		}
	}
}

// A team's own cases against idemhttp: one that holds passes with its
// reason, one whose expectation the endpoint does not meet fails naming
// the step and what it wanted, and one that needs an option not given is
// not applicable.
func TestOwnCases(t *testing.T) {
	t.Parallel()
	cfg := paymentsConfig(newPaymentsAPI(t, false, nil))
	cfg.History, cfg.SlowHeader = 0, ""
	cfg.Cases = []idemprobe.Case{
		{
			Name:  "replay-marked",
			Title: "a retry is marked as a replay and carries the first Location",
			Steps: []idemprobe.Step{
				{Name: "first", Want: idemprobe.Want{Status: []int{201}, Header: []string{"Location"}}},
				{Name: "retry", Want: idemprobe.Want{Same: "first", Replayed: true, Header: []string{"Location"}}},
				// Another key is another payment.
				{Name: "other-key", Key: "b", Want: idemprobe.Want{Other: "first"}},
			},
			Effect: 2,
			Pass:   "replayed and marked",
		},
		{
			Name:  "lost-then-copies",
			Title: "after a lost answer, copies of the retry all get the first execution's answer",
			Steps: []idemprobe.Step{
				{Name: "lost", HangUp: true},
				{Name: "retries", Copies: 4, Want: idemprobe.Want{Replayed: true}},
			},
			Effect: 1,
		},
		{
			Name:  "wrong-expectation",
			Title: "a reused key with another body is accepted (it is not: this case is wrong)",
			Steps: []idemprobe.Step{
				{Name: "first"},
				{Name: "other", OtherBody: true, Want: idemprobe.Want{Status: []int{2}}},
			},
			Effect: 2,
		},
		{
			Name:  "fault-then-retry",
			Title: "a 5xx keeps nothing: the retry runs, under another credential given as a header",
			Steps: []idemprobe.Step{
				{Name: "fault", Fault: true, Want: idemprobe.Want{Status: []int{5}}},
				{Name: "retry", Want: idemprobe.Want{Status: []int{201}, Other: "fault"}},
				{Name: "theirs", Header: http.Header{"Authorization": {tokenOther}}, Want: idemprobe.Want{Other: "retry"}},
				{Name: "get", Method: http.MethodGet, NoKey: true, Want: idemprobe.Want{Status: []int{405}}},
			},
			Effect: 2,
		},
		{
			Name:  "needs-slow",
			Steps: []idemprobe.Step{{Slow: true, Background: true}, {Want: idemprobe.Want{Conflict: true}}},
		},
	}
	rep, err := idemprobe.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status idemprobe.Status
		says   string
	}{
		"replay-marked":     {idemprobe.Pass, "replayed and marked"},
		"lost-then-copies":  {idemprobe.Pass, "retries: 4 answered 201 Created"},
		"wrong-expectation": {idemprobe.Fail, "other: answered 422 Unprocessable Entity, want 2xx; the effect grew by 1, want 2"},
		"fault-then-retry":  {idemprobe.Pass, "fault: 503 Service Unavailable; retry: 201 Created"},
		"needs-slow":        {idemprobe.NotApplicable, "no --slow-header given"},
	}
	// Cases that name no source end their lines without a citation.
	if out := text(t, rep); strings.Contains(out, "[]") {
		t.Errorf("a line cites nothing in brackets:\n%s", out)
	}
	for i, c := range rep.Checks {
		w, ok := want[c.Name]
		if !ok {
			continue
		}
		if c.Status != w.status || !strings.Contains(c.Reason, w.says) {
			t.Errorf("%s: %s %q, want %s saying %q", c.Name, c.Status, c.Reason, w.status, w.says)
		}
		if i < 13 || c.Number != i {
			t.Errorf("%s is check %d at %d, want it after the probe's 13, numbered on", c.Name, c.Number, i)
		}
	}
}

// markedTwice runs every request, a duplicate in flight included, and
// marks a duplicate's answer as a replay all the same: the mark is no
// proof that the answer is the first execution's. A request with X-Slow
// is held until its duplicate has arrived, so that the duplicate is
// certainly in flight.
type markedTwice struct {
	mu   sync.Mutex
	n    int
	keys map[string]*arrival
}

type arrival struct {
	dup  chan struct{}
	once sync.Once
}

func (h *markedTwice) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	h.mu.Lock()
	a, seen := h.keys[key]
	if !seen {
		a = &arrival{dup: make(chan struct{})}
		h.keys[key] = a
	}
	h.n++
	id := h.n
	h.mu.Unlock()
	switch {
	case seen:
		a.once.Do(func() { close(a.dup) })
		w.Header().Set("Idempotent-Replayed", "true")
	case r.Header.Get("X-Slow") != "":
		select {
		case <-a.dup:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ord_%d"}`, id)
}

// A duplicate in flight that ran again is no conflict and no wait, even
// marked as a replay: the answer must be the first's.
func TestConflictWantsTheFirstsAnswer(t *testing.T) {
	t.Parallel()
	rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{
		Handler:    &markedTwice{keys: map[string]*arrival{}},
		URL:        "/orders",
		SlowHeader: "X-Slow: 1",
		Cases:      idemprobe.DraftCases()[1:2], // draft-concurrent-conflict
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if (c.Name == "in-flight-duplicate" || c.Name == "draft-concurrent-conflict") && c.Status != idemprobe.Fail {
			t.Errorf("%s: %s %q, want a failure", c.Name, c.Status, c.Reason)
		}
	}
}

// refusesOnce refuses a key reused with another body the first time only:
// sent again uncorrected, the other body runs. The draft's §2.7 says the
// resource MUST fail a retry the client did not correct.
type refusesOnce struct {
	mu      sync.Mutex
	n       int
	first   map[string]string // key → body of its first request
	answers map[string]string // key and body → answer
	refused map[string]bool   // key and body → refused once
}

func (h *refusesOnce) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	key, body := r.Header.Get("Idempotency-Key"), string(b)
	if key == "" {
		http.Error(w, "a key is required", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if first, ok := h.first[key]; ok && first != body && !h.refused[key+" "+body] {
		h.refused[key+" "+body] = true
		http.Error(w, "key reused with another body", http.StatusUnprocessableEntity)
		return
	}
	if _, ok := h.first[key]; !ok {
		h.first[key] = body
	}
	a, ok := h.answers[key+" "+body]
	if !ok {
		h.n++
		a = fmt.Sprintf(`{"id":"ord_%d"}`, h.n)
		h.answers[key+" "+body] = a
	} else {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, a)
}

// draft-corrected-retry holds the resource to §2.7's MUST: a retry that
// was not corrected is refused again.
func TestDraftUncorrectedRetryRefusedAgain(t *testing.T) {
	t.Parallel()
	rep, err := idemprobe.Run(t.Context(), &idemprobe.Config{
		Handler: &refusesOnce{first: map[string]string{}, answers: map[string]string{}, refused: map[string]bool{}},
		URL:     "/orders",
		Body:    `{"item":"book {{n}}"}`,
		Cases:   idemprobe.DraftCases(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Name == "draft-corrected-retry" && (c.Status != idemprobe.Fail || !strings.Contains(c.Reason, "uncorrected")) {
			t.Errorf("draft-corrected-retry: %s %q, want a failure of the uncorrected retry", c.Status, c.Reason)
		}
	}
}
