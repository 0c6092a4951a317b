package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// Start is the time every Clock handed out by TestStore starts at. It is a
// whole second, and the suite moves clocks by whole milliseconds, so a store
// that keeps times with millisecond precision still round-trips them
// exactly.
var Start = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)

// Default lease and TTL of the requests the suite makes.
const (
	lease = 10 * time.Second
	ttl   = time.Hour
)

// TestStore runs the conformance suite for idem.Store, and for
// idem.TxStore, idem.TxClaimer, idem.Replayer, idem.Restarter and
// idem.Waiter when the store implements them, as subtests of t.
//
// newStore is called once per subtest, from that subtest's goroutine, and
// must return a fresh, empty store that reads the time from clock. It should
// register any cleanup with t.Cleanup. Subtests run in parallel, so the
// stores they get must not share records.
func TestStore(t *testing.T, newStore func(t *testing.T, clock idem.Clock) idem.Store) {
	t.Helper()
	for _, tc := range storeTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newEnv(t, newStore))
		})
	}

	t.Run("TxStore", func(t *testing.T) {
		t.Parallel()
		if _, ok := newStore(t, idemmem.NewClock(Start)).(idem.TxStore); !ok {
			t.Skip("the store does not implement idem.TxStore")
		}
		for _, tc := range txStoreTests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, newStore)
				tc.run(t, e, e.store.(idem.TxStore))
			})
		}
	})

	t.Run("TxClaimer", func(t *testing.T) {
		t.Parallel()
		if _, ok := newStore(t, idemmem.NewClock(Start)).(idem.TxClaimer); !ok {
			t.Skip("the store does not implement idem.TxClaimer")
		}
		for _, tc := range txClaimerTests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, newStore)
				tc.run(t, e, e.store.(idem.TxClaimer))
			})
		}
	})

	t.Run("Replayer", func(t *testing.T) {
		t.Parallel()
		if _, ok := newStore(t, idemmem.NewClock(Start)).(idem.Replayer); !ok {
			t.Skip("the store does not implement idem.Replayer")
		}
		e := newEnv(t, newStore)
		testReplayer(t, e, e.store.(idem.Replayer))
	})

	t.Run("Restarter", func(t *testing.T) {
		t.Parallel()
		if _, ok := newStore(t, idemmem.NewClock(Start)).(idem.Restarter); !ok {
			t.Skip("the store does not implement idem.Restarter")
		}
		for _, tc := range restarterTests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, newStore)
				tc.run(t, e, e.store.(idem.Restarter))
			})
		}
	})

	t.Run("LocalClock", func(t *testing.T) {
		t.Parallel()
		clock := idemmem.NewClock(Start)
		lc, ok := newStore(t, clock).(idem.LocalClock)
		if !ok {
			t.Skip("the store does not implement idem.LocalClock")
		}
		// The clock it was given, which decides its leases (see the
		// Renew and ClaimNew cases): a caller given the same clock then
		// knows it for its own, and may count a lease to the end the
		// store reports.
		if got := lc.LeaseClock(); got != idem.Clock(clock) {
			t.Fatalf("LeaseClock() = %T %v; want the Clock the store was given", got, got)
		}
	})

	t.Run("Waiter", func(t *testing.T) {
		t.Parallel()
		if _, ok := newStore(t, idemmem.NewClock(Start)).(idem.Waiter); !ok {
			t.Skip("the store does not implement idem.Waiter")
		}
		for _, tc := range waiterTests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, newStore)
				tc.run(t, e, e.store.(idem.Waiter))
			})
		}
	})
}

var storeTests = []struct {
	name string
	run  func(t *testing.T, e *env)
}{
	{"ClaimNew", testClaimNew},
	{"ConcurrentClaimOneKey", testConcurrentClaimOneKey},
	{"ConcurrentClaimManyKeys", testConcurrentClaimManyKeys},
	{"Replay", testReplay},
	{"Mismatch", testMismatch},
	{"Unseen", testUnseen},
	{"Scopes", testScopes},
	{"LeaseTakeover", testLeaseTakeover},
	{"StaleHolder", testStaleHolder},
	{"ExpiredLeaseHolder", testExpiredLeaseHolder},
	{"CompleteTwice", testCompleteTwice},
	{"ReleaseThenClaim", testReleaseThenClaim},
	{"ReleaseAbsent", testReleaseAbsent},
	{"ReleaseAfterComplete", testReleaseAfterComplete},
	{"TTLExpiry", testTTLExpiry},
	{"Purge", testPurge},
	{"InvalidClaim", testInvalidClaim},
	{"CancelledContext", testCancelledContext},
	{"GetUnknown", testGetUnknown},
	{"Renew", testRenew},
	{"RenewRefused", testRenewRefused},
	{"RenewLateHolder", testRenewLateHolder},
	{"RenewOutlivesTTL", testRenewOutlivesTTL},
	{"RenewInvalid", testRenewInvalid},
	{"Linearizable", testLinearizable},
}

// env is one subtest's store, clock and context, with assertions that
// stop the subtest on an unexpected error.
type env struct {
	t     *testing.T
	ctx   context.Context
	clock *idemmem.Clock
	store idem.Store
}

func newEnv(t *testing.T, newStore func(*testing.T, idem.Clock) idem.Store) *env {
	t.Helper()
	clock := idemmem.NewClock(Start)
	s := newStore(t, clock)
	if s == nil {
		t.Fatal("newStore returned a nil store")
	}
	return &env{t: t, ctx: t.Context(), clock: clock, store: s}
}

// req returns a request in scope "s" with the suite's lease and TTL.
func (e *env) req(key, fingerprint string) idem.ClaimRequest {
	return idem.ClaimRequest{
		Scope:       "s",
		Key:         idem.Key(key),
		Fingerprint: idem.Fingerprint(fingerprint),
		Lease:       lease,
		TTL:         ttl,
	}
}

func (e *env) claim(req idem.ClaimRequest) idem.Claim {
	e.t.Helper()
	c, err := e.store.Claim(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Claim(%q, %q): %v", req.Scope, req.Key, err)
	}
	return c
}

// acquire claims req and fails unless it gets Acquired.
func (e *env) acquire(req idem.ClaimRequest) idem.Claim {
	e.t.Helper()
	c := e.claim(req)
	if c.Outcome != idem.Acquired {
		e.t.Fatalf("Claim(%q, %q) = %v, want acquired", req.Scope, req.Key, c.Outcome)
	}
	return c
}

func (e *env) complete(ref idem.Ref, resp idem.Response) {
	e.t.Helper()
	if err := e.store.Complete(e.ctx, ref, resp); err != nil {
		e.t.Fatalf("Complete(%q, %q, token %d): %v", ref.Scope, ref.Key, ref.Token, err)
	}
}

func (e *env) get(scope idem.Scope, key idem.Key) idem.Record {
	e.t.Helper()
	r, err := e.store.Get(e.ctx, scope, key)
	if err != nil {
		e.t.Fatalf("Get(%q, %q): %v", scope, key, err)
	}
	return r
}

func (e *env) wantNotFound(scope idem.Scope, key idem.Key) {
	e.t.Helper()
	r, err := e.store.Get(e.ctx, scope, key)
	if !errors.Is(err, idem.ErrNotFound) {
		e.t.Fatalf("Get(%q, %q) = %+v, %v; want ErrNotFound", scope, key, r, err)
	}
}

func (e *env) purge(limit int) int {
	e.t.Helper()
	n, err := e.store.Purge(e.ctx, limit)
	if err != nil {
		e.t.Fatalf("Purge(%d): %v", limit, err)
	}
	return n
}

func ref(c idem.Claim) idem.Ref {
	return idem.Ref{Scope: c.Record.Scope, Key: c.Record.Key, Token: c.Token}
}

// sampleResponse returns a response whose every part must survive a round
// trip: repeated and empty header values, and a body that is not UTF-8.
func sampleResponse() idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"X-Multi":      {"a", "b"},
			"X-Empty":      {""},
		},
		Body: []byte("{\"id\":1}\x00\xff\xfe"),
	}
}

// checkRecord reports every field of got that differs from want. Times are
// compared with Equal, so a store may return them in any location.
func checkRecord(t *testing.T, what string, got, want idem.Record) {
	t.Helper()
	var diffs []string
	diff := func(field string, g, w any) {
		diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", field, g, w))
	}
	if got.Scope != want.Scope {
		diff("Scope", got.Scope, want.Scope)
	}
	if got.Key != want.Key {
		diff("Key", got.Key, want.Key)
	}
	if got.Fingerprint != want.Fingerprint {
		diff("Fingerprint", got.Fingerprint, want.Fingerprint)
	}
	if got.State != want.State {
		diff("State", got.State, want.State)
	}
	if got.Token != want.Token {
		diff("Token", got.Token, want.Token)
	}
	for _, tm := range []struct {
		name      string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"LeaseExpiresAt", got.LeaseExpiresAt, want.LeaseExpiresAt},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
		{"CompletedAt", got.CompletedAt, want.CompletedAt},
	} {
		if !tm.got.Equal(tm.want) {
			diff(tm.name, tm.got, tm.want)
		}
	}
	if d := responseDiff(got.Response, want.Response); d != "" {
		diffs = append(diffs, d)
	}
	if got.Holder != want.Holder {
		diff("Holder", got.Holder, want.Holder)
	}
	if len(diffs) > 0 {
		t.Errorf("%s: record differs:\n\t%s\n\tgot  %+v\n\twant %+v", what, joinLines(diffs), got, want)
	}
}

func joinLines(lines []string) string {
	var b bytes.Buffer
	for i, l := range lines {
		if i > 0 {
			b.WriteString("\n\t")
		}
		b.WriteString(l)
	}
	return b.String()
}

// responseDiff describes how got differs from want, or returns "". A nil
// and an empty header, or a nil and an empty body, count as equal.
func responseDiff(got, want *idem.Response) string {
	switch {
	case got == nil && want == nil:
		return ""
	case got == nil:
		return fmt.Sprintf("Response = nil, want %+v", *want)
	case want == nil:
		return fmt.Sprintf("Response = %+v, want nil", *got)
	}
	var diffs []string
	if got.Status != want.Status {
		diffs = append(diffs, fmt.Sprintf("Response.Status = %d, want %d", got.Status, want.Status))
	}
	if !headerEqual(got.Header, want.Header) {
		diffs = append(diffs, fmt.Sprintf("Response.Header = %v, want %v", got.Header, want.Header))
	}
	if !bytes.Equal(got.Body, want.Body) {
		diffs = append(diffs, fmt.Sprintf("Response.Body = %q, want %q", got.Body, want.Body))
	}
	if got.BodyOmitted != want.BodyOmitted {
		diffs = append(diffs, fmt.Sprintf("Response.BodyOmitted = %v, want %v", got.BodyOmitted, want.BodyOmitted))
	}
	return joinLines(diffs)
}

func headerEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !slices.Equal(av, bv) {
			return false
		}
	}
	return true
}

func testClaimNew(t *testing.T, e *env) {
	req := e.req("new", "fp-1")
	c := e.acquire(req)
	if c.TookOver {
		t.Error("TookOver = true for a new key")
	}
	if c.Token == 0 {
		t.Error("Token = 0, want a non-zero fencing token")
	}
	want := idem.Record{
		Scope:          req.Scope,
		Key:            req.Key,
		Fingerprint:    req.Fingerprint,
		State:          idem.StateInFlight,
		Token:          c.Token,
		CreatedAt:      Start,
		LeaseExpiresAt: Start.Add(req.Lease),
		ExpiresAt:      Start.Add(req.TTL),
	}
	checkRecord(t, "Claim", c.Record, want)
	e.clock.Advance(time.Second)
	checkRecord(t, "Get", e.get(req.Scope, req.Key), want)
}

// race runs n calls of fn at once, released together, and waits for them.
func race(n int, fn func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			fn(i)
		})
	}
	close(start)
	wg.Wait()
}

func testConcurrentClaimOneKey(t *testing.T, e *env) {
	const n = 64
	req := e.req("contended", "fp")
	claims := make([]idem.Claim, n)
	errs := make([]error, n)
	race(n, func(i int) { claims[i], errs[i] = e.store.Claim(e.ctx, req) })

	var winner idem.Claim
	acquired := 0
	for i, c := range claims {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if c.Outcome == idem.Acquired {
			acquired++
			winner = c
		}
	}
	if acquired != 1 {
		t.Fatalf("%d of %d concurrent claims got acquired, want exactly 1", acquired, n)
	}
	for i, c := range claims {
		if c.Outcome == idem.Acquired {
			continue
		}
		if c.Outcome != idem.InFlight {
			t.Errorf("claim %d = %v, want in_flight", i, c.Outcome)
		}
		if c.Token != 0 {
			t.Errorf("claim %d: Token = %d with %v, want 0", i, c.Token, c.Outcome)
		}
		if c.Record.Token != winner.Token {
			t.Errorf("claim %d: Record.Token = %d, want the winner's %d", i, c.Record.Token, winner.Token)
		}
	}
	if got := e.get(req.Scope, req.Key); got.Token != winner.Token || got.State != idem.StateInFlight {
		t.Errorf("Get = token %d, %v; want the winner's token %d, in_flight", got.Token, got.State, winner.Token)
	}
}

func testConcurrentClaimManyKeys(t *testing.T, e *env) {
	const goroutines, keys = 64, 32
	var (
		mu       sync.Mutex
		acquired = make(map[idem.Key]int)
		inFlight = make(map[idem.Key]int)
		failures []string
	)
	race(goroutines, func(g int) {
		// Each goroutine walks the keys from a different starting point, so
		// every key is contended at a different moment.
		for j := range keys {
			key := fmt.Sprintf("key-%02d", (g+j)%keys)
			c, err := e.store.Claim(e.ctx, e.req(key, "fp"))
			mu.Lock()
			switch {
			case err != nil:
				failures = append(failures, fmt.Sprintf("goroutine %d, %s: %v", g, key, err))
			case c.Outcome == idem.Acquired:
				acquired[idem.Key(key)]++
			case c.Outcome == idem.InFlight:
				inFlight[idem.Key(key)]++
			default:
				failures = append(failures, fmt.Sprintf("goroutine %d, %s: outcome %v", g, key, c.Outcome))
			}
			mu.Unlock()
		}
	})
	for _, f := range failures {
		t.Error(f)
	}
	for j := range keys {
		key := idem.Key(fmt.Sprintf("key-%02d", j))
		if acquired[key] != 1 || inFlight[key] != goroutines-1 {
			t.Errorf("%s: %d acquired and %d in_flight, want 1 and %d", key, acquired[key], inFlight[key], goroutines-1)
		}
	}
}

func testReplay(t *testing.T, e *env) {
	cases := []struct {
		name string
		resp func() idem.Response
	}{
		{"full", sampleResponse},
		{"body omitted", func() idem.Response {
			return idem.Response{Status: http.StatusOK, Header: http.Header{"Content-Length": {"99999999"}}, BodyOmitted: true}
		}},
		{"no header, empty body", func() idem.Response {
			return idem.Response{Status: http.StatusNoContent}
		}},
		{"deterministic failure", func() idem.Response {
			return idem.Response{Status: http.StatusUnprocessableEntity, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"insufficient funds"}`)}
		}},
	}
	for _, tc := range cases {
		req := e.req("replay-"+tc.name, "fp")
		c := e.acquire(req)
		e.clock.Advance(time.Second)
		completedAt := e.clock.Now()
		stored := tc.resp()
		e.complete(ref(c), stored)
		// The store keeps its own copy: a caller that reuses its buffers
		// must not change the stored answer.
		if stored.Header != nil {
			stored.Header.Set("X-Mutated", "yes")
		}
		if len(stored.Body) > 0 {
			stored.Body[0] = '!'
		}
		stored.Status = 599

		want := tc.resp()
		wantRec := c.Record
		wantRec.State = idem.StateCompleted
		wantRec.Response = &want
		wantRec.CompletedAt = completedAt

		for range 2 {
			e.clock.Advance(time.Second)
			dup := e.claim(req)
			if dup.Outcome != idem.Completed {
				t.Fatalf("%s: duplicate Claim = %v, want completed", tc.name, dup.Outcome)
			}
			if dup.Token != 0 || dup.TookOver {
				t.Errorf("%s: duplicate Claim has Token %d, TookOver %v; want 0, false", tc.name, dup.Token, dup.TookOver)
			}
			checkRecord(t, tc.name+": duplicate Claim", dup.Record, wantRec)
			checkRecord(t, tc.name+": Get", e.get(req.Scope, req.Key), wantRec)
		}
	}
}

func testMismatch(t *testing.T, e *env) {
	a, b := e.req("k", "fp-a"), e.req("k", "fp-b")
	c := e.acquire(a)

	check := func(when string, state idem.State) {
		t.Helper()
		m := e.claim(b)
		if m.Outcome != idem.Mismatch {
			t.Fatalf("%s: Claim with another fingerprint = %v, want mismatch", when, m.Outcome)
		}
		if m.Token != 0 || m.TookOver {
			t.Errorf("%s: mismatch has Token %d, TookOver %v; want 0, false", when, m.Token, m.TookOver)
		}
		if m.Record.Fingerprint != a.Fingerprint || m.Record.Token != c.Token || m.Record.State != state {
			t.Errorf("%s: mismatch Record = fingerprint %q, token %d, %v; want %q, %d, %v",
				when, m.Record.Fingerprint, m.Record.Token, m.Record.State, a.Fingerprint, c.Token, state)
		}
	}
	check("in flight", idem.StateInFlight)

	// An ended lease is taken over only by the same request.
	e.clock.Advance(lease)
	check("in flight, lease ended", idem.StateInFlight)
	if got := e.get(a.Scope, a.Key); got.Token != c.Token {
		t.Fatalf("after a mismatched claim, Get has token %d, want %d", got.Token, c.Token)
	}

	e.complete(ref(c), sampleResponse())
	check("completed", idem.StateCompleted)
	if got := e.get(a.Scope, a.Key); got.Fingerprint != a.Fingerprint || got.State != idem.StateCompleted {
		t.Errorf("after a mismatched claim, Get = %q, %v; want %q, completed", got.Fingerprint, got.State, a.Fingerprint)
	}
}

// testUnseen: a claim marked Unseen (the caller saw no sign of the key)
// has the outcome any claim has, whatever the key's state: the mark only
// lets a store skip a read.
func testUnseen(t *testing.T, e *env) {
	unseen := func(req idem.ClaimRequest) idem.ClaimRequest { req.Unseen = true; return req }
	a, b := e.req("unseen", "fp-a"), e.req("unseen", "fp-b")
	c := e.acquire(unseen(a))
	check := func(state idem.State, same, other idem.Outcome) {
		t.Helper()
		for _, tc := range []struct {
			req  idem.ClaimRequest
			want idem.Outcome
		}{{a, same}, {b, other}} {
			got := e.claim(unseen(tc.req))
			if got.Outcome != tc.want || got.Record.State != state || got.Record.Token != c.Token || got.Token != 0 {
				t.Errorf("%v key, fingerprint %q: Unseen claim = %v of a %v record (token %d), token %d; want %v of the record (token %d), token 0",
					state, tc.req.Fingerprint, got.Outcome, got.Record.State, got.Record.Token, got.Token, tc.want, c.Token)
			}
		}
	}
	check(idem.StateInFlight, idem.InFlight, idem.Mismatch)
	e.complete(ref(c), sampleResponse())
	check(idem.StateCompleted, idem.Completed, idem.Mismatch)
	if got := e.claim(unseen(a)); got.Record.Response == nil || got.Record.Response.Status != sampleResponse().Status {
		t.Errorf("Unseen claim of a completed key: response %+v, want the kept one", got.Record.Response)
	}
}

func testScopes(t *testing.T, e *env) {
	scopes := []idem.Scope{"tenant-a", "tenant-b", ""}
	claims := make(map[idem.Scope]idem.Claim)
	for i, s := range scopes {
		req := e.req("shared-key", fmt.Sprintf("fp-%d", i))
		req.Scope = s
		claims[s] = e.acquire(req)
	}

	resp := sampleResponse()
	e.complete(ref(claims["tenant-a"]), resp)
	if err := e.store.Release(e.ctx, ref(claims["tenant-b"])); err != nil {
		t.Fatalf("Release in tenant-b: %v", err)
	}

	if r := e.get("tenant-a", "shared-key"); r.State != idem.StateCompleted || responseDiff(r.Response, &resp) != "" {
		t.Errorf("tenant-a: Get = %v, %+v; want completed with the stored response", r.State, r.Response)
	}
	e.wantNotFound("tenant-b", "shared-key")
	if r := e.get("", "shared-key"); r.State != idem.StateInFlight || r.Token != claims[""].Token || r.Fingerprint != "fp-2" {
		t.Errorf("empty scope: Get = %v, token %d, %q; want in_flight, %d, fp-2", r.State, r.Token, r.Fingerprint, claims[""].Token)
	}
}

func testLeaseTakeover(t *testing.T, e *env) {
	req := e.req("k", "fp")
	first := e.acquire(req)

	e.clock.Advance(lease - time.Millisecond)
	if c := e.claim(req); c.Outcome != idem.InFlight || c.Record.Token != first.Token {
		t.Fatalf("Claim 1ms before the lease ends = %v (record token %d), want in_flight (token %d)", c.Outcome, c.Record.Token, first.Token)
	}

	e.clock.Advance(time.Millisecond)
	now := e.clock.Now()
	second := e.acquire(req)
	if !second.TookOver {
		t.Error("TookOver = false when taking over an ended lease")
	}
	if second.Token <= first.Token {
		t.Errorf("takeover token %d is not greater than the first token %d", second.Token, first.Token)
	}
	want := first.Record
	want.Token = second.Token
	want.LeaseExpiresAt = now.Add(lease)
	checkRecord(t, "takeover Claim", second.Record, want)
	checkRecord(t, "Get after takeover", e.get(req.Scope, req.Key), want)

	if c := e.claim(req); c.Outcome != idem.InFlight || c.Record.Token != second.Token {
		t.Errorf("Claim after takeover = %v (record token %d), want in_flight (token %d)", c.Outcome, c.Record.Token, second.Token)
	}

	// A second takeover again gets a greater token.
	e.clock.Advance(lease)
	third := e.acquire(req)
	if !third.TookOver || third.Token <= second.Token {
		t.Errorf("second takeover: TookOver %v, token %d; want true and a token greater than %d", third.TookOver, third.Token, second.Token)
	}
}

func testStaleHolder(t *testing.T, e *env) {
	req := e.req("k", "fp")
	old := e.acquire(req)
	e.clock.Advance(lease)
	cur := e.acquire(req)
	if !cur.TookOver {
		t.Fatal("expected a takeover")
	}

	if err := e.store.Complete(e.ctx, ref(old), sampleResponse()); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete with the taken-over token = %v, want ErrLeaseLost", err)
	}
	if err := e.store.Release(e.ctx, ref(old)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Release with the taken-over token = %v, want ErrLeaseLost", err)
	}
	checkRecord(t, "Get after the stale holder's attempts", e.get(req.Scope, req.Key), cur.Record)

	resp := idem.Response{Status: http.StatusOK, Body: []byte("new holder")}
	e.complete(ref(cur), resp)
	if err := e.store.Complete(e.ctx, ref(old), sampleResponse()); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete with the taken-over token after the new holder completed = %v, want ErrLeaseLost", err)
	}
	if err := e.store.Release(e.ctx, ref(old)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Release with the taken-over token after the new holder completed = %v, want ErrLeaseLost", err)
	}
	if r := e.get(req.Scope, req.Key); r.Token != cur.Token || responseDiff(r.Response, &resp) != "" {
		t.Errorf("Get = token %d, response %+v; want the new holder's token %d and response", r.Token, r.Response, cur.Token)
	}
}

func testExpiredLeaseHolder(t *testing.T, e *env) {
	// Nobody took the key over, so the token still owns it: completing late
	// is better than running the effect twice.
	req := e.req("complete-late", "fp")
	c := e.acquire(req)
	e.clock.Advance(2 * lease)
	resp := sampleResponse()
	e.complete(ref(c), resp)
	if dup := e.claim(req); dup.Outcome != idem.Completed || responseDiff(dup.Record.Response, &resp) != "" {
		t.Errorf("Claim after a late Complete = %v, %+v; want completed with the response", dup.Outcome, dup.Record.Response)
	}

	req = e.req("release-late", "fp")
	c = e.acquire(req)
	e.clock.Advance(2 * lease)
	if err := e.store.Release(e.ctx, ref(c)); err != nil {
		t.Fatalf("late Release: %v", err)
	}
	e.wantNotFound(req.Scope, req.Key)
	if again := e.acquire(req); again.TookOver {
		t.Error("Claim after a Release reports TookOver")
	}
}

func testCompleteTwice(t *testing.T, e *env) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.clock.Advance(time.Second)
	completedAt := e.clock.Now()
	first := sampleResponse()
	e.complete(ref(c), first)
	e.clock.Advance(time.Second)
	if err := e.store.Complete(e.ctx, ref(c), idem.Response{Status: http.StatusTeapot}); err != nil {
		t.Fatalf("second Complete with the same token = %v, want nil", err)
	}
	want := c.Record
	want.State = idem.StateCompleted
	want.Response = &first
	want.CompletedAt = completedAt
	checkRecord(t, "Get after a second Complete", e.get(req.Scope, req.Key), want)
}

func testReleaseThenClaim(t *testing.T, e *env) {
	req := e.req("k", "fp")
	first := e.acquire(req)
	if err := e.store.Release(e.ctx, ref(first)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.wantNotFound(req.Scope, req.Key)
	if err := e.store.Release(e.ctx, ref(first)); err != nil {
		t.Errorf("Release again = %v, want nil", err)
	}
	if err := e.store.Complete(e.ctx, ref(first), sampleResponse()); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete after Release = %v, want ErrLeaseLost", err)
	}
	e.wantNotFound(req.Scope, req.Key)

	e.clock.Advance(time.Millisecond)
	second := e.acquire(req)
	if second.TookOver {
		t.Error("Claim after a Release reports TookOver")
	}
	if second.Token <= first.Token {
		t.Errorf("token after Release %d is not greater than the released token %d", second.Token, first.Token)
	}
	if !second.Record.CreatedAt.Equal(e.clock.Now()) {
		t.Errorf("CreatedAt = %v, want %v (a new execution)", second.Record.CreatedAt, e.clock.Now())
	}
	if err := e.store.Complete(e.ctx, ref(first), sampleResponse()); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete with the released token = %v, want ErrLeaseLost", err)
	}
	if err := e.store.Release(e.ctx, ref(first)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Release with the released token while another holds the key = %v, want ErrLeaseLost", err)
	}
	checkRecord(t, "Get", e.get(req.Scope, req.Key), second.Record)
}

func testReleaseAbsent(t *testing.T, e *env) {
	if err := e.store.Release(e.ctx, idem.Ref{Scope: "s", Key: "never-claimed", Token: 12345}); err != nil {
		t.Errorf("Release of an absent key = %v, want nil", err)
	}
	e.wantNotFound("s", "never-claimed")
}

func testReleaseAfterComplete(t *testing.T, e *env) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	resp := sampleResponse()
	e.complete(ref(c), resp)
	if err := e.store.Release(e.ctx, ref(c)); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Release after Complete = %v, want ErrLeaseLost", err)
	}
	if r := e.get(req.Scope, req.Key); r.State != idem.StateCompleted || responseDiff(r.Response, &resp) != "" {
		t.Errorf("Get = %v, %+v; want completed with the response", r.State, r.Response)
	}
}

func testTTLExpiry(t *testing.T, e *env) {
	req := e.req("completed", "fp-a")
	req.TTL = time.Minute
	first := e.acquire(req)
	e.complete(ref(first), sampleResponse())

	e.clock.Set(Start.Add(req.TTL - time.Millisecond))
	e.get(req.Scope, req.Key)
	if c := e.claim(req); c.Outcome != idem.Completed {
		t.Fatalf("Claim 1ms before the TTL ends = %v, want completed", c.Outcome)
	}

	e.clock.Set(Start.Add(req.TTL))
	e.wantNotFound(req.Scope, req.Key)
	other := req
	other.Fingerprint = "fp-b"
	second := e.acquire(other)
	if second.TookOver {
		t.Error("Claim of an expired key reports TookOver")
	}
	if second.Token <= first.Token {
		t.Errorf("token %d of the new claim is not greater than the expired one %d", second.Token, first.Token)
	}
	now := e.clock.Now()
	checkRecord(t, "Claim of an expired key", second.Record, idem.Record{
		Scope:          req.Scope,
		Key:            req.Key,
		Fingerprint:    other.Fingerprint,
		State:          idem.StateInFlight,
		Token:          second.Token,
		CreatedAt:      now,
		LeaseExpiresAt: now.Add(req.Lease),
		ExpiresAt:      now.Add(req.TTL),
	})
	if err := e.store.Complete(e.ctx, ref(first), sampleResponse()); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete with the token of the expired record = %v, want ErrLeaseLost", err)
	}

	// An abandoned in-flight record expires too.
	abandoned := e.req("abandoned", "fp")
	abandoned.Lease, abandoned.TTL = time.Minute, time.Minute
	a := e.acquire(abandoned)
	e.clock.Advance(time.Minute)
	e.wantNotFound(abandoned.Scope, abandoned.Key)
	if again := e.acquire(abandoned); again.Token <= a.Token {
		t.Errorf("token %d after expiry is not greater than %d", again.Token, a.Token)
	}
}

func testPurge(t *testing.T, e *env) {
	short := func(key string) idem.ClaimRequest {
		r := e.req(key, "fp")
		r.TTL = time.Minute
		return r
	}
	oldTokens := make(map[idem.Key]idem.Token)
	// 25 records whose TTL will have passed: 20 completed, 5 abandoned in
	// flight with their lease ended.
	for i := range 20 {
		c := e.acquire(short(fmt.Sprintf("done-%02d", i)))
		e.complete(ref(c), sampleResponse())
		oldTokens[c.Record.Key] = c.Token
	}
	for i := range 5 {
		c := e.acquire(short(fmt.Sprintf("abandoned-%d", i)))
		oldTokens[c.Record.Key] = c.Token
	}
	e.acquire(short("held"))

	// Live records: some in flight, some completed.
	e.clock.Set(Start.Add(30 * time.Second))
	var live []idem.Claim
	for i := range 5 {
		c := e.acquire(e.req(fmt.Sprintf("live-%d", i), "fp"))
		if i%2 == 0 {
			e.complete(ref(c), sampleResponse())
		}
		live = append(live, c)
	}

	// held is taken over just before its TTL ends, so at purge time its TTL
	// has passed but a live lease still holds it.
	e.clock.Set(Start.Add(55 * time.Second))
	held := e.acquire(short("held"))
	if !held.TookOver {
		t.Fatal("expected a takeover of held")
	}

	e.clock.Set(Start.Add(61 * time.Second))
	// A limit must be positive: 0 and below are refused, and purge
	// nothing (the counts below find all 25 records).
	for _, limit := range []int{0, -1} {
		if n, err := e.store.Purge(e.ctx, limit); !errors.Is(err, idem.ErrInvalidArgument) || n != 0 {
			t.Fatalf("Purge(%d) = %d, %v; want 0 and an error matching idem.ErrInvalidArgument", limit, n, err)
		}
	}
	for i, want := range []int{10, 10, 5, 0} {
		if got := e.purge(10); got != want {
			t.Fatalf("Purge(10) call %d = %d, want %d (25 expired records, limit 10)", i+1, got, want)
		}
	}

	for _, c := range live {
		if r := e.get(c.Record.Scope, c.Record.Key); r.Token != c.Token {
			t.Errorf("live record %s: token %d after Purge, want %d", c.Record.Key, r.Token, c.Token)
		}
	}
	// held survived: its holder still owns it. Once completed its TTL has
	// passed and nothing holds it, so the next Purge takes it.
	if err := e.store.Complete(e.ctx, ref(held), sampleResponse()); err != nil {
		t.Errorf("Complete of the leased record after Purge = %v, want nil (it must not be purged)", err)
	}
	if got := e.purge(10); got != 1 {
		t.Errorf("Purge after the leased record completed = %d, want 1", got)
	}

	for key, old := range oldTokens {
		e.wantNotFound("s", key)
		if c := e.acquire(short(string(key))); c.Token <= old {
			t.Errorf("%s: token %d after purge is not greater than the purged %d", key, c.Token, old)
		}
	}
}

func testInvalidClaim(t *testing.T, e *env) {
	valid := e.req("k", "fp")
	cases := []struct {
		name   string
		mutate func(*idem.ClaimRequest)
	}{
		{"empty key", func(r *idem.ClaimRequest) { r.Key = "" }},
		{"empty fingerprint", func(r *idem.ClaimRequest) { r.Fingerprint = "" }},
		{"zero lease", func(r *idem.ClaimRequest) { r.Lease = 0 }},
		{"negative lease", func(r *idem.ClaimRequest) { r.Lease = -time.Second }},
		{"zero TTL", func(r *idem.ClaimRequest) { r.TTL = 0 }},
		{"TTL shorter than lease", func(r *idem.ClaimRequest) { r.TTL = r.Lease - time.Millisecond }},
		{"holder without incarnation", func(r *idem.ClaimRequest) { r.Holder = idem.Holder{Replica: "a"} }},
		{"holder without replica", func(r *idem.ClaimRequest) { r.Holder = idem.Holder{Incarnation: "1"} }},
		{"holder with a control character", func(r *idem.ClaimRequest) { r.Holder = idem.Holder{Replica: "a", Incarnation: "1\x00"} }},
		{"holder not UTF-8", func(r *idem.ClaimRequest) { r.Holder = idem.Holder{Replica: "\xff", Incarnation: "1"} }},
		{"holder too long", func(r *idem.ClaimRequest) {
			r.Holder = idem.Holder{Replica: "a", Incarnation: strings.Repeat("1", idem.MaxHolderLen+1)}
		}},
	}
	for _, tc := range cases {
		req := valid
		tc.mutate(&req)
		c, err := e.store.Claim(e.ctx, req)
		var argErr *idem.ArgumentError
		if !errors.Is(err, idem.ErrInvalidArgument) || !errors.As(err, &argErr) {
			t.Errorf("%s: Claim error = %v, want an *idem.ArgumentError matching ErrInvalidArgument", tc.name, err)
		}
		if c.Outcome == idem.Acquired {
			t.Errorf("%s: Claim = acquired", tc.name)
		}
		e.wantNotFound(req.Scope, req.Key)
	}
	// Nothing was stored, so the valid request is a first claim.
	if c := e.acquire(valid); c.TookOver {
		t.Error("valid Claim after invalid ones reports TookOver")
	}
}

func testCancelledContext(t *testing.T, e *env) {
	req := e.req("k", "fp")
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	c, err := e.store.Claim(ctx, req)
	if err == nil {
		t.Fatalf("Claim with a cancelled context = %v, nil; want an error", c.Outcome)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Claim with a cancelled context = %v, want an error matching context.Canceled", err)
	}
	if c.Outcome == idem.Acquired {
		t.Error("Claim with a cancelled context returned acquired")
	}

	// The store still works, and a claim that may have been made is
	// recovered the documented way: in flight until the lease ends.
	after := e.claim(req)
	if after.Outcome == idem.InFlight {
		e.clock.Advance(lease)
		after = e.claim(req)
	}
	if after.Outcome != idem.Acquired {
		t.Errorf("Claim after the cancelled one = %v, want acquired", after.Outcome)
	}
}

func testGetUnknown(t *testing.T, e *env) {
	e.wantNotFound("s", "unknown")
	e.acquire(e.req("known", "fp"))
	e.wantNotFound("other-scope", "known")
}

// testReplayer checks that Replay answers exactly the duplicates a claim
// would answer Completed or Mismatch from a completed record, with the
// response the claim would carry, and leaves every other key to the claim.
func testReplayer(t *testing.T, e *env, r idem.Replayer) {
	replay := func(key, fp string) (*idem.Response, bool) {
		t.Helper()
		resp, mismatch, err := r.Replay(e.ctx, "s", idem.Key(key), idem.Fingerprint(fp))
		if err != nil {
			t.Fatalf("Replay(%q, %q): %v", key, fp, err)
		}
		return resp, mismatch
	}
	wantNothing := func(when, key, fp string) {
		t.Helper()
		if resp, mismatch := replay(key, fp); resp != nil || mismatch {
			t.Errorf("%s: Replay = %+v, mismatch %v; want neither (the claim decides)", when, resp, mismatch)
		}
	}

	wantNothing("no record", "absent", "fp")

	c := e.acquire(e.req("k", "fp"))
	wantNothing("in flight", "k", "fp")
	wantNothing("in flight, another fingerprint", "k", "other")

	for _, tc := range []struct {
		key  string
		resp idem.Response
	}{
		{"k", sampleResponse()},
		{"omitted", idem.Response{Status: http.StatusOK, Header: http.Header{"Content-Length": {"99999999"}}, BodyOmitted: true}},
		{"bare", idem.Response{Status: http.StatusNoContent}},
	} {
		held := c
		if tc.key != "k" {
			held = e.acquire(e.req(tc.key, "fp"))
		}
		e.complete(ref(held), tc.resp)
		got, mismatch := replay(tc.key, "fp")
		if got == nil || mismatch {
			t.Fatalf("%s: Replay of a completed key = %+v, mismatch %v; want its response", tc.key, got, mismatch)
		}
		if d := responseDiff(got, &tc.resp); d != "" {
			t.Errorf("%s: Replay: %s", tc.key, d)
		}
		if claim := e.claim(e.req(tc.key, "fp")); claim.Outcome != idem.Completed {
			t.Fatalf("%s: Claim after Replay = %v, want completed: Replay must not write", tc.key, claim.Outcome)
		}
		if resp, mismatch := replay(tc.key, "other"); resp != nil || !mismatch {
			t.Errorf("%s: Replay with another fingerprint = %+v, mismatch %v; want mismatch and no response", tc.key, resp, mismatch)
		}
	}
	if resp, mismatch := replay("k", "fp"); resp == nil || mismatch {
		t.Fatalf("before expiry: Replay = %+v, mismatch %v; want the response", resp, mismatch)
	}
	other, mismatch, err := r.Replay(e.ctx, "other-scope", "k", "fp")
	if err != nil || other != nil || mismatch {
		t.Errorf("Replay in another scope = %+v, mismatch %v, %v; want neither", other, mismatch, err)
	}

	// Past the TTL the record no longer counts: the claim runs the request
	// anew.
	e.clock.Advance(ttl)
	wantNothing("expired", "k", "fp")
	wantNothing("expired, another fingerprint", "k", "other")
	if claim := e.claim(e.req("k", "fp")); claim.Outcome != idem.Acquired {
		t.Errorf("Claim of the expired key = %v, want acquired", claim.Outcome)
	}

	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, _, err := r.Replay(cancelled, "s", "omitted", "fp"); err == nil {
		t.Error("Replay with a cancelled context: no error")
	}
}
