package idemhttp_test

import (
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A handler that calls several services at once, each call named, sends
// each call with the same key in every execution, although its calls
// start in another order: here the first execution starts them in one
// order and fails after a recovery point, and the retry goes on from the
// point and starts them in another.
func TestNamedCallsKeepTheirKeysAcrossExecutions(t *testing.T) {
	t.Parallel()
	legs := []string{"debit", "credit", "fee", "notify", "audit", "ledger"}
	// Each execution starts its calls in an order of its own, drawn from
	// a seeded source, so that a failure can be replayed.
	rnd := rand.New(rand.NewPCG(36, 1))
	var orders [][]string
	for len(orders) < 2 {
		o := slices.Clone(legs)
		rnd.Shuffle(len(o), func(i, j int) { o[i], o[j] = o[j], o[i] })
		if len(orders) == 0 || o[0] != orders[0][0] { // another call first, at least
			orders = append(orders, o)
		}
	}

	type arrival struct{ leg, key string }
	var mu sync.Mutex
	var arrivals [][]arrival // per execution, in the order the calls arrived
	client := &http.Client{Transport: &idemhttp.RoundTripper{Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		last := &arrivals[len(arrivals)-1]
		*last = append(*last, arrival{string(body), r.Header.Get(idemhttp.HeaderKey)})
		mu.Unlock()
		return &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})}}

	var resumed []string // each execution's recovery point
	want := map[string]string{}
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), KeySecret: []byte("0123456789abcdef0123"),
		InflightWait: -1})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		ex, _ := idemhttp.ExecutionFromContext(ctx)
		mu.Lock()
		run := len(arrivals)
		arrivals = append(arrivals, nil)
		resumed = append(resumed, ex.Recovery.Name)
		mu.Unlock()
		if ex.Recovery.IsZero() {
			if err := idemhttp.SaveRecovery(ctx, "calling", nil); err != nil {
				t.Errorf("SaveRecovery: %v", err)
			}
		}
		// One goroutine per call; each starts when let go, in this
		// execution's order, and the next is let go once it is done.
		gates := map[string]chan struct{}{}
		done := make(chan error)
		for _, leg := range legs {
			gate := make(chan struct{})
			gates[leg] = gate
			go func() {
				<-gate
				req, err := http.NewRequestWithContext(idemhttp.WithCallName(ctx, "leg", leg), "POST", "http://ledger.test/v1/entries", strings.NewReader(leg))
				if err == nil {
					var resp *http.Response
					if resp, err = client.Do(req); err == nil {
						resp.Body.Close()
					}
				}
				done <- err
			}()
			if k, ok := idemhttp.DownstreamKey(ctx, "leg", leg); ok && run == 0 {
				mu.Lock()
				want[leg] = k
				mu.Unlock()
			}
		}
		for _, leg := range orders[run] {
			close(gates[leg])
			if err := <-done; err != nil {
				t.Errorf("call %s: %v", leg, err)
			}
		}
		if run == 0 {
			w.WriteHeader(http.StatusServiceUnavailable) // after the point: the key is kept in flight, yielded
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if res := do(t, h, "POST", "/transfers", "t-1", `{"amount":10}`); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("first execution: %d %s", res.Status, res.Body)
	}
	if res := do(t, h, "POST", "/transfers", "t-1", `{"amount":10}`); res.Status != http.StatusCreated {
		t.Fatalf("the retry: %d %s", res.Status, res.Body)
	}
	if len(arrivals) != 2 || !slices.Equal(resumed, []string{"", "calling"}) {
		t.Fatalf("%d executions, from points %q; want 2, the second resumed from calling", len(arrivals), resumed)
	}
	keys := make([]map[string]string, 2)
	for run, as := range arrivals {
		keys[run] = map[string]string{}
		var order []string
		for _, a := range as {
			keys[run][a.leg] = a.key
			order = append(order, a.leg)
		}
		if !slices.Equal(order, orders[run]) {
			t.Fatalf("execution %d: the calls arrived in the order %q; want %q", run+1, order, orders[run])
		}
	}
	seen := map[string]bool{}
	for _, leg := range legs {
		k := keys[0][leg]
		if k == "" || k != keys[1][leg] || k != want[leg] || seen[k] {
			t.Fatalf("keys of %s: %q then %q (DownstreamKey %q); want one key per call, the same in both executions, distinct: %v",
				leg, k, keys[1][leg], want[leg], keys)
		}
		seen[k] = true
		if strings.Contains(k, "t-1") {
			t.Fatalf("the downstream key %q shows the client's key", k)
		}
	}
	if _, ok := idemhttp.DownstreamKey(t.Context(), "leg"); ok {
		t.Fatal("DownstreamKey outside a protected request: ok; want false")
	}
	if got := idemhttp.WithCallName(t.Context(), "leg"); got != t.Context() {
		t.Fatal("WithCallName outside a protected request changed the context")
	}
}
