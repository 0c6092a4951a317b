package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A duplicate of a request still running is answered 409 with Retry-After
// the time left on the holder's lease, by the engine's clock, not a
// constant; the RoundTripper waits all of it, past its Policy.Cap (5s by
// default), before it retries; the retry gets the first execution's answer
// replayed, and the handler runs once.
func TestRetryAfterFromTheLeaseHonoured(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Lease: 10 * time.Second, Clock: clock, Timers: clock,
		InflightWait: -1})
	var runs atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(entered)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	})))
	t.Cleanup(srv.Close)
	post := func(c *http.Client) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderKey, "k")
		resp, err := c.Do(req)
		if err != nil {
			t.Errorf("POST: %v", err)
			return nil, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	first := make(chan string, 1)
	go func() {
		resp, body := post(srv.Client())
		if resp != nil && resp.StatusCode != http.StatusCreated {
			t.Errorf("the first request: %d %s", resp.StatusCode, body)
		}
		first <- body
	}()
	<-entered
	// 3s into the lease: the heartbeat ticked (every sixth of the lease)
	// but renews nothing before a third of it; 7s of the lease are left.
	clock.Advance(3 * time.Second)

	var slept []time.Duration
	client := &http.Client{Transport: &idemhttp.RoundTripper{Base: srv.Client().Transport,
		Sleep: func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			// The holder finishes while the client waits.
			close(release)
			<-first
			return nil
		}}}
	resp, body := post(client)
	if resp == nil {
		return
	}
	if resp.StatusCode != http.StatusCreated || body != "paid" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("the duplicate, after its retry: %d %q (replayed %q); want the first's 201 replayed", resp.StatusCode, body, resp.Header.Get(idemhttp.HeaderReplayed))
	}
	if len(slept) != 1 || slept[0] != 7*time.Second {
		t.Fatalf("the client waited %v; want once, the 7s left on the holder's lease", slept)
	}
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
}

// A server that asks for more than MaxRetryAfter gets its retry after
// MaxRetryAfter.
func TestRoundTripperRetryAfterBounded(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var slept []time.Duration
	tr := &idemhttp.RoundTripper{
		Sleep: func(ctx context.Context, d time.Duration) error { slept = append(slept, d); return nil },
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				h := http.Header{"Retry-After": {"86400"}}
				return &http.Response{StatusCode: http.StatusConflict, Header: h, Body: io.NopCloser(strings.NewReader(""))}, nil
			}
			return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}, nil
		}),
	}
	req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", strings.NewReader("{}"))
	if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("RoundTrip = %v, %v", resp, err)
	}
	if len(slept) != 1 || slept[0] != idemhttp.MaxRetryAfter {
		t.Fatalf("slept %v; want MaxRetryAfter (%v)", slept, idemhttp.MaxRetryAfter)
	}
}
