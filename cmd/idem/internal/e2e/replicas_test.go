package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// TestReplicasShareKeys: 200 concurrent duplicates of one payment, split
// across two replicas that share one PostgreSQL (and then one Redis for the
// keys), make exactly one payment, and every client gets it.
func TestReplicasShareKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		redisKeys bool
	}{
		{"PostgreSQL", false},
		{"PostgreSQL+Redis", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if tc.redisKeys {
				e.withRedisKeys()
			}
			testDuplicatesAcrossReplicas(t, e)
		})
	}
}

func testDuplicatesAcrossReplicas(t *testing.T, e *testEnv) {
	const (
		clients = 200
		initial = 1_000_000
		amount  = 12_345
	)
	// Both replicas boot together: their migrations must not trip over
	// each other either.
	rs := startReplicas(t, e, e.serveArgs("--faults"), "A", "B")
	accountID := e.createAccount(t, rs[0].URL, initial)

	key := "dup-" + randHex(8)
	body := paymentBody(accountID, amount, key)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A client retries 409 (a duplicate still in flight past the wait) and
	// 5xx with the same key, as a well-behaved client does.
	hc := &http.Client{Transport: &idemhttp.RoundTripper{
		Base:   newHTTPTransport(),
		Policy: idem.RetryPolicy{MaxAttempts: 10, Base: 100 * time.Millisecond, Cap: 2 * time.Second},
	}}
	defer hc.CloseIdleConnections()

	results := make([]result, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			// The delay holds the first execution in flight, so the
			// duplicates overlap it on both replicas.
			req := e.paymentRequest(ctx, rs[i%2].URL, key, body, "delay=300ms")
			<-start
			results[i] = do(hc, req)
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d duplicates answered in %s", clients, time.Since(began).Round(time.Millisecond))

	// Summarised, not one line per client: when this breaks, it breaks for
	// most of the 200.
	var id string
	executed := 0
	var wrong []string
	ids := map[string]int{}
	for i, r := range results {
		if r.err != nil || r.status != http.StatusCreated {
			wrong = append(wrong, fmt.Sprintf("client %d (replica %s): %s", i, rs[i%2].name, r))
			continue
		}
		ids[r.paymentID]++
		if id == "" {
			id = r.paymentID
		}
		if !r.replayed {
			executed++
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%d of %d clients did not end with 201, for example:\n%s", len(wrong), clients, strings.Join(wrong[:min(len(wrong), 5)], "\n"))
	}
	if len(ids) > 1 {
		t.Errorf("clients were answered with %d different payments, want one", len(ids))
	}
	if executed != 1 {
		t.Errorf("%d clients got a first-execution answer (no Idempotent-Replayed), want exactly 1", executed)
	}
	if n := e.executions(t, rs...); n != 1 {
		t.Errorf("the replicas' metrics count %d executions of the payment, want 1", n)
	}

	ps := e.payments(t, rs[1].URL, accountID)
	if len(ps) != 1 {
		t.Fatalf("account has %d payments, want exactly 1: %+v", len(ps), ps)
	}
	if ps[0].ID != id || ps[0].Amount != amount || ps[0].Description != key {
		t.Errorf("recorded payment %+v, want id %s amount %d", ps[0], id, amount)
	}
	for _, r := range rs {
		if got := e.balance(t, r.URL, accountID); got != initial-amount {
			t.Errorf("balance through replica %s = %d, want %d (debited once)", r.name, got, initial-amount)
		}
	}
}

// TestReplicaKilledMidPayment: a replica dies while a payment is in flight
// and the client retries on the other replica.
func TestReplicaKilledMidPayment(t *testing.T) {
	t.Parallel()
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		testKilledInFlight(t, newEnv(t))
	})
	t.Run("PostgreSQL+Redis/crash-after-commit", func(t *testing.T) {
		t.Parallel()
		testCrashAfterCommit(t, newEnv(t).withRedisKeys())
	})
}

// failover is the load balancer of a client that retries elsewhere: the
// first attempt goes to the first target, later ones to the next. Later
// attempts drop the Idem-Fault header, which was meant for the first
// replica only (the fingerprint does not cover it, so the key still
// matches). It records every attempt.
type failover struct {
	base    http.RoundTripper
	targets []*url.URL
	// beforeRetry, if set, runs once before the second attempt: the moment
	// after the first replica failed and before the retry reaches the next.
	beforeRetry func()

	mu       sync.Mutex
	attempts []attempt
}

type attempt struct {
	target string
	status int
	err    error
}

func (a attempt) String() string {
	if a.err != nil {
		return fmt.Sprintf("%s: error %v", a.target, a.err)
	}
	return fmt.Sprintf("%s: %d", a.target, a.status)
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	n := len(f.attempts)
	f.mu.Unlock()
	target := f.targets[min(n, len(f.targets)-1)]
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = target.Scheme, target.Host, ""
	if n > 0 {
		req.Header.Del("Idem-Fault")
	}
	if n == 1 && f.beforeRetry != nil {
		f.beforeRetry()
	}
	resp, err := f.base.RoundTrip(req)
	a := attempt{target: target.Host, err: err}
	if resp != nil {
		a.status = resp.StatusCode
	}
	f.mu.Lock()
	f.attempts = append(f.attempts, a)
	f.mu.Unlock()
	return resp, err
}

func (f *failover) log() []attempt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]attempt(nil), f.attempts...)
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// failoverClient sends a first attempt to a and every retry to b, with the
// same key, until a final answer.
func failoverClient(t *testing.T, a, b *replica) (*http.Client, *failover) {
	t.Helper()
	fo := &failover{base: newHTTPTransport(), targets: []*url.URL{mustURL(t, a.URL), mustURL(t, b.URL)}}
	return &http.Client{Transport: &idemhttp.RoundTripper{
		Base:   fo,
		Policy: idem.RetryPolicy{MaxAttempts: 12, Base: 100 * time.Millisecond, Cap: time.Second},
	}}, fo
}

// checkFirstAttemptDied asserts that the first attempt reached replica a
// and was cut off by its death (not answered).
func checkFirstAttemptDied(t *testing.T, fo *failover, a *replica) {
	t.Helper()
	log := fo.log()
	if len(log) < 2 {
		t.Fatalf("attempts %v: want the first to fail on %s and a retry", log, a.name)
	}
	if first := log[0]; first.target != mustURL(t, a.URL).Host || first.err == nil {
		t.Errorf("first attempt %v: want a connection error from replica %s (%s), which was killed mid-request", first, a.name, a.URL)
	}
}

// testKilledInFlight: PostgreSQL holds keys and money. A is SIGKILLed while
// the payment is in flight, before its transaction (which holds the key's
// claim too) could commit; the server rolls it back, and the client's retry
// on B claims the key and really runs the payment: one payment, one debit,
// a 201.
func testKilledInFlight(t *testing.T, e *testEnv) {
	const initial, amount = 50_000, 700
	rs := startReplicas(t, e, e.serveArgs("--faults", "--key-lease", "2s"), "A", "B")
	a, b := rs[0], rs[1]
	accountID := e.createAccount(t, b.URL, initial)

	key := "kill-" + randHex(8)
	hc, fo := failoverClient(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		done <- do(hc, e.paymentRequest(ctx, a.URL, key, paymentBody(accountID, amount, key), "delay=2s"))
	}()

	// In flight: A has claimed the key in its transaction and is holding
	// the request in its delay.
	waitFor(t, "the payment's key to be claimed on A", 10*time.Second, func() bool {
		open, err := e.keyClaimOpen(ctx)
		if err != nil {
			t.Logf("polling the key: %v", err)
		}
		return open
	})
	a.kill(t)

	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("the client did not finish")
	}
	if res.err != nil || res.status != http.StatusCreated {
		t.Fatalf("client ended with %s, want 201; attempts %v", res, fo.log())
	}
	checkFirstAttemptDied(t, fo, a)
	if res.replayed {
		t.Errorf("the retry on B was a replay; A died before committing, so it must have run for real")
	}
	ps := e.payments(t, b.URL, accountID)
	if len(ps) != 1 || ps[0].ID != res.paymentID || ps[0].Amount != amount {
		t.Fatalf("payments %+v, want exactly the one the client got (%s)", ps, res.paymentID)
	}
	if got := e.balance(t, b.URL, accountID); got != initial-amount {
		t.Errorf("balance %d, want %d", got, initial-amount)
	}
	t.Logf("attempts: %v", fo.log())
}

// testCrashAfterCommit: Redis holds the keys, PostgreSQL the money. A kills
// itself right after the payment's transaction commits and before the key
// completes in Redis. The key stays in flight under A's lease; the retry on
// B takes it over when the lease ends, runs the handler again, and must find
// the payment A made (the payment row carries its key) instead of charging
// again: the same payment id, one debit.
func testCrashAfterCommit(t *testing.T, e *testEnv) {
	const initial, amount = 50_000, 900
	rs := startReplicas(t, e, e.serveArgs("--faults", "--key-lease", "2s"), "A", "B")
	a, b := rs[0], rs[1]
	accountID := e.createAccount(t, b.URL, initial)

	key := "crash-" + randHex(8)
	hc, fo := failoverClient(t, a, b)
	// Between A's death and the retry, look at what A left behind.
	var committed []payment
	var balanceAfterCrash int64
	var keyState string
	var crashErr error
	fo.beforeRetry = func() {
		select {
		case <-a.done:
		case <-time.After(exitTimeout):
			crashErr = errors.New("replica A is still running after the first attempt failed")
			return
		}
		if !a.killedBySIGKILL() {
			crashErr = fmt.Errorf("replica A exited with %s, want killed by SIGKILL", a.cmd.ProcessState)
			return
		}
		committed = e.payments(t, b.URL, accountID)
		balanceAfterCrash = e.balance(t, b.URL, accountID)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keyState, crashErr = e.redisKeyState(ctx, key)
	}
	a.expectExit.Store(true)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := do(hc, e.paymentRequest(ctx, a.URL, key, paymentBody(accountID, amount, key), "crash-after-commit"))
	if crashErr != nil {
		t.Fatal(crashErr)
	}
	if res.err != nil || res.status != http.StatusCreated {
		t.Fatalf("client ended with %s, want 201; attempts %v", res, fo.log())
	}
	checkFirstAttemptDied(t, fo, a)
	if len(committed) != 1 || balanceAfterCrash != initial-amount {
		t.Fatalf("after A's crash: payments %+v, balance %d; want the payment committed (1 payment, balance %d) "+
			"— otherwise this test does not reach the window between the two stores", committed, balanceAfterCrash, initial-amount)
	}
	if keyState != "in_flight" {
		t.Fatalf("after A's crash the key's Redis record is in state %q, want in_flight: the crash must fall between the commit and the key's completion", keyState)
	}
	if res.paymentID != committed[0].ID {
		t.Errorf("the retry answered payment %s, but A had committed %s: the key's payment must be found, not made again", res.paymentID, committed[0].ID)
	}
	ps := e.payments(t, b.URL, accountID)
	if len(ps) != 1 || ps[0].ID != committed[0].ID {
		t.Errorf("payments after the retry %+v, want only %s", ps, committed[0].ID)
	}
	if got := e.balance(t, b.URL, accountID); got != initial-amount {
		t.Errorf("balance %d after the retry, want %d: debited once", got, initial-amount)
	}
	// The key must now be completed: another duplicate is a replay of the
	// same answer, wherever it lands.
	again := do(&http.Client{Transport: newHTTPTransport()}, e.paymentRequest(ctx, b.URL, key, paymentBody(accountID, amount, key), ""))
	if again.status != http.StatusCreated || !again.replayed || again.paymentID != committed[0].ID {
		t.Errorf("a later duplicate got %s, want a 201 replay of %s", again, committed[0].ID)
	}
	t.Logf("attempts: %v", fo.log())
}
