package e2e

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Shape of the load and the outage. The load is bounded (workers × at most
// maxPerWorker payments, each account well under the API's largest page);
// it runs until enough payments have succeeded after the restart.
const (
	loadWorkers      = 4
	maxPerWorker     = 400
	warmupPayments   = 40 // succeeded before the outage begins
	recoveryPayments = 40 // succeeded after the restart before the load stops
	outage           = 3 * time.Second
	loadBudget       = 2 * time.Minute // every client gives up by then
	loadInitial      = 1_000_000_000
)

// TestStoreRestartUnderLoad stops the database a replica depends on, under
// load, and starts it again: PostgreSQL holding keys and money, then Redis
// holding the keys in front of PostgreSQL. Private instances stand in for
// the shared services, which must stay up for every other test.
func TestStoreRestartUnderLoad(t *testing.T) {
	t.Parallel()
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		pg := startPrivatePG(t)
		e := newEnvAt(t, pg.URL)
		testRestartUnderLoad(t, e, func() { pg.stop(t) }, func() { pg.start(t) })
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		rd := startPrivateRedis(t)
		e.useRedis(rd.URL)
		testRestartUnderLoad(t, e, func() { rd.stop(t) }, func() { rd.start(t) })
	})
}

// loadAttempt is one attempt of one payment, as the client saw it.
type loadAttempt struct {
	key        string
	start, end time.Time
	status     int
	problem    bool // Content-Type application/problem+json
	retryAfter string
	err        error
}

func (a loadAttempt) String() string {
	if a.err != nil {
		return fmt.Sprintf("key %s at %s: error %v", a.key, a.start.Format("15:04:05.000"), a.err)
	}
	return fmt.Sprintf("key %s at %s: %d (problem+json %t, Retry-After %q)", a.key, a.start.Format("15:04:05.000"), a.status, a.problem, a.retryAfter)
}

// attemptRecorder records every attempt the retrying client makes.
type attemptRecorder struct {
	base http.RoundTripper
	mu   sync.Mutex
	all  []loadAttempt
}

func (r *attemptRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	a := loadAttempt{key: req.Header.Get(idemhttp.HeaderKey), start: time.Now()}
	resp, err := r.base.RoundTrip(req)
	a.end, a.err = time.Now(), err
	if resp != nil {
		a.status = resp.StatusCode
		mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		a.problem = mt == "application/problem+json"
		a.retryAfter = resp.Header.Get("Retry-After")
	}
	r.mu.Lock()
	r.all = append(r.all, a)
	r.mu.Unlock()
	return resp, err
}

// issued is one payment the load asked for, and how its client ended.
type issued struct {
	key       string
	accountID string
	amount    int64
	res       result
}

func testRestartUnderLoad(t *testing.T, e *testEnv, stop, start func()) {
	// A short lease: a key left in flight by an execution the outage broke
	// (its release could not reach the store) is taken over by the retry
	// seconds later, not after the default minute.
	r := startReplicas(t, e, e.serveArgs("--key-lease", "3s"), "A")[0]
	accounts := make([]string, loadWorkers)
	for w := range accounts {
		accounts[w] = e.createAccount(t, r.URL, loadInitial)
	}

	rec := &attemptRecorder{base: newHTTPTransport()}
	// Enough attempts, spaced at most 500ms apart, to outlast the outage
	// several times over.
	hc := &http.Client{Transport: &idemhttp.RoundTripper{
		Base:   rec,
		Policy: idem.RetryPolicy{MaxAttempts: 200, Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), loadBudget)
	defer cancel()

	run := randHex(4)
	var succeeded atomic.Int64
	stopLoad := make(chan struct{})
	var mu sync.Mutex
	var all []issued
	var wg sync.WaitGroup
	for w := range loadWorkers {
		wg.Go(func() {
			for i := range maxPerWorker {
				select {
				case <-stopLoad:
					return
				default:
				}
				p := issued{key: fmt.Sprintf("load-%s-%d-%d", run, w, i), accountID: accounts[w], amount: int64(1 + (w*7919+i)%997)}
				p.res = do(hc, e.paymentRequest(ctx, r.URL, p.key, paymentBody(p.accountID, p.amount, p.key), ""))
				mu.Lock()
				all = append(all, p)
				mu.Unlock()
				if p.res.err == nil && p.res.status == http.StatusCreated {
					succeeded.Add(1)
				}
			}
		})
	}
	stopped := false
	defer func() {
		if !stopped {
			close(stopLoad)
			cancel()
			wg.Wait()
		}
	}()

	waitFor(t, "payments before the outage", 30*time.Second, func() bool { return succeeded.Load() >= warmupPayments })
	stop()
	downFrom := time.Now()
	t.Logf("store stopped after %d payments", succeeded.Load())
	// The outage itself: a stretch of time the store stays away, not a wait
	// for some state.
	<-time.After(outage)
	downUntil := time.Now()
	start()
	waitFor(t, "the replica's /healthz after the restart", 30*time.Second, func() bool { return r.healthy(e.hc) })
	back := succeeded.Load()
	t.Logf("store back after %s; %d payments so far", time.Since(downFrom).Round(time.Millisecond), back)
	waitFor(t, "payments after the restart", time.Minute, func() bool { return succeeded.Load() >= back+recoveryPayments })
	close(stopLoad)
	wg.Wait()
	stopped = true
	if !r.alive() {
		t.Fatalf("the replica died during the outage: %s", r.cmd.ProcessState)
	}

	// Every attempt: a 201, a 503 problem, a 409 in flight with Retry-After,
	// or a broken connection. Never a 500, never anything else. A 201 may
	// be answered during the outage when its work committed before it (with
	// Redis keys, the payment commits in PostgreSQL and only the key's
	// completion fails); the books below check that every 201 is recorded.
	// But a request that arrived after the store was gone cannot have
	// committed anything before it came back.
	inWindow, refusedInWindow := 0, 0
	for _, a := range rec.all {
		answeredDuring := a.end.After(downFrom) && a.end.Before(downUntil)
		if answeredDuring {
			inWindow++
		}
		switch {
		case a.err != nil:
		case a.status == http.StatusCreated:
			if a.start.After(downFrom) && answeredDuring {
				t.Errorf("a request sent while the store was down was answered 201 before it came back: %s", a)
			}
		case a.status == http.StatusServiceUnavailable && a.problem:
			if answeredDuring {
				refusedInWindow++
			}
		case a.status == http.StatusConflict && a.problem && a.retryAfter != "":
		default:
			t.Errorf("unexpected answer: %s", a)
		}
	}
	if refusedInWindow == 0 {
		t.Errorf("no request was refused with 503 while the store was down (%d answered in the window): the outage was not exercised", inWindow)
	}
	t.Logf("%d payments, %d attempts, %d of them answered while the store was down (%d with 503)", len(all), len(rec.all), inWindow, refusedInWindow)

	// Every client ended with 201, and the books agree with the clients.
	byKey := make(map[string]issued, len(all))
	for _, p := range all {
		if p.res.err != nil || p.res.status != http.StatusCreated {
			t.Errorf("payment %s ended with %s, want 201 after retries", p.key, p.res)
		}
		byKey[p.key] = p
	}
	for w, acct := range accounts {
		seen := map[string]int{}
		var sum int64
		for _, got := range e.payments(t, r.URL, acct) {
			seen[got.Description]++
			sum += got.Amount
			want, ok := byKey[got.Description]
			switch {
			case !ok || want.accountID != acct:
				t.Errorf("account %d: payment %+v matches no key the load sent to it", w, got)
			case got.Amount != want.amount:
				t.Errorf("payment %s for key %s: amount %d, want %d", got.ID, got.Description, got.Amount, want.amount)
			case want.res.paymentID != "" && got.ID != want.res.paymentID:
				t.Errorf("key %s: recorded payment %s, but the client was answered %s", got.Description, got.ID, want.res.paymentID)
			}
		}
		for _, p := range all {
			if p.accountID == acct && seen[p.key] != 1 {
				t.Errorf("key %s has %d payments, want exactly 1", p.key, seen[p.key])
			}
		}
		if got := e.balance(t, r.URL, acct); got != loadInitial-sum {
			t.Errorf("account %d: balance %d, want %d (initial minus its %d recorded payments)", w, got, loadInitial-sum, len(seen))
		}
	}

	// The events went on too: the relay and the settlement consumer, whose
	// transport (the database) failed under them, resumed by themselves,
	// and every payment is settled once.
	var total int64
	for _, p := range all {
		total += p.amount
	}
	waitFor(t, "every payment settled after the restart", time.Minute, func() bool {
		return e.settlement(t, r.URL).Events >= int64(len(all))
	})
	if s := e.settlement(t, r.URL); s.Events != int64(len(all)) || s.Total != total {
		t.Errorf("settlement = %+v, want %d over %d events", s, total, len(all))
	}
}
