package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

func noSleep(ctx context.Context, d time.Duration) error { return ctx.Err() }

// TestTransportLostResponse: the server commits, then the connection drops
// before the answer; the transport retries with the same key and gets the
// first execution's answer, so the effect happens once.
func TestTransportLostResponse(t *testing.T) {
	t.Parallel()
	var executions atomic.Int64
	var dropped atomic.Bool
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := executions.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d", n)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dropped.CompareAndSwap(false, true) {
			inner.ServeHTTP(httptest.NewRecorder(), r) // runs and commits; the answer is lost
			panic(http.ErrAbortHandler)
		}
		inner.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var keys sync.Map
	tr := &idemhttp.RoundTripper{Sleep: noSleep, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		keys.Store(r.Header.Get(idemhttp.HeaderKey), true)
		return http.DefaultTransport.RoundTrip(r)
	})}
	client := &http.Client{Transport: tr}
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "payment 1" || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if executions.Load() != 1 {
		t.Fatalf("executions %d", executions.Load())
	}
	n := 0
	keys.Range(func(k, _ any) bool {
		n++
		if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(k.(string)) {
			t.Errorf("key %q is not a UUID v4", k)
		}
		return true
	})
	if n != 1 {
		t.Fatalf("%d distinct keys across attempts; want 1", n)
	}
	srv.CloseClientConnections()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransportRetryRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		statuses []int
		headers  []string // Retry-After per attempt, "" for none
		want     int
		attempts int
	}{
		{[]int{503, 201}, []string{"1", ""}, 201, 2},
		{[]int{500, 502, 504, 201}, nil, 201, 4},
		{[]int{409, 201}, []string{"1", ""}, 201, 2},
		{[]int{409}, nil, 409, 1}, // a 409 without Retry-After is a real conflict
		{[]int{422}, nil, 422, 1},
		{[]int{400}, nil, 400, 1},
		{[]int{402}, nil, 402, 1},
		{[]int{503, 503, 503, 503, 503}, nil, 503, 4}, // bounded by MaxAttempts (4)
	}
	for i, tc := range tests {
		var attempts int
		var slept []time.Duration
		tr := &idemhttp.RoundTripper{
			Sleep: func(ctx context.Context, d time.Duration) error { slept = append(slept, d); return nil },
			Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				b, _ := io.ReadAll(r.Body)
				if string(b) != "body" {
					t.Errorf("case %d: attempt %d sent body %q", i, attempts+1, b)
				}
				h := http.Header{}
				if attempts < len(tc.headers) && tc.headers[attempts] != "" {
					h.Set("Retry-After", tc.headers[attempts])
				}
				st := tc.statuses[min(attempts, len(tc.statuses)-1)]
				attempts++
				return &http.Response{StatusCode: st, Header: h, Body: io.NopCloser(strings.NewReader(""))}, nil
			}),
		}
		req, _ := http.NewRequest("POST", "http://idem.invalid/", strings.NewReader("body"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if resp.StatusCode != tc.want || attempts != tc.attempts {
			t.Errorf("case %d: status %d after %d attempts; want %d after %d", i, resp.StatusCode, attempts, tc.want, tc.attempts)
		}
		if len(tc.headers) > 0 && tc.headers[0] == "1" && (len(slept) == 0 || slept[0] < time.Second) {
			t.Errorf("case %d: Retry-After 1 not honoured: slept %v", i, slept)
		}
	}
}

func TestTransportLeavesSafeMethodsAlone(t *testing.T) {
	t.Parallel()
	var attempts int
	tr := &idemhttp.RoundTripper{Sleep: noSleep, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		attempts++
		if r.Header.Get(idemhttp.HeaderKey) != "" {
			t.Error("GET was given a key")
		}
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody}, nil
	})}
	req, _ := http.NewRequest("GET", "http://idem.invalid/", nil)
	if resp, _ := tr.RoundTrip(req); resp.StatusCode != 503 || attempts != 1 {
		t.Fatalf("GET retried: %d attempts", attempts)
	}
	// A caller's own key is kept.
	tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get(idemhttp.HeaderKey) != "mine" {
			t.Errorf("key replaced: %q", r.Header.Get(idemhttp.HeaderKey))
		}
		return &http.Response{StatusCode: 201, Header: http.Header{}, Body: http.NoBody}, nil
	})
	req, _ = http.NewRequest("POST", "http://idem.invalid/", strings.NewReader("x"))
	req.Header.Set(idemhttp.HeaderKey, "mine")
	tr.RoundTrip(req)
}

// Retry-After as an HTTP date is honoured like delay-seconds.
func TestRoundTripperRetryAfterDate(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var calls atomic.Int64
	var slept []time.Duration
	tr := &idemhttp.RoundTripper{
		Now:   func() time.Time { return now },
		Sleep: func(ctx context.Context, d time.Duration) error { slept = append(slept, d); return nil },
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				h := http.Header{"Retry-After": {now.Add(3 * time.Second).Format(http.TimeFormat)}}
				return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: h, Body: io.NopCloser(strings.NewReader(""))}, nil
			}
			return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}, nil
		}),
	}
	req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("RoundTrip = %v, %v", resp, err)
	}
	if len(slept) != 1 || slept[0] != 3*time.Second {
		t.Errorf("slept %v, want the 3s the HTTP date asked for", slept)
	}
}

// No retry starts that could not begin before the context's deadline: the
// caller gets the last attempt's answer at once.
func TestRoundTripperRespectsDeadline(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	tr := &idemhttp.RoundTripper{
		Sleep: func(ctx context.Context, d time.Duration) error {
			t.Errorf("slept %v past the deadline", d)
			return nil
		},
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls.Add(1)
			h := http.Header{"Retry-After": {"10"}}
			return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: h, Body: io.NopCloser(strings.NewReader(""))}, nil
		}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://example.invalid/pay", strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || calls.Load() != 1 {
		t.Fatalf("RoundTrip = %v, %v after %d attempts; want the 503 after one attempt", resp, err, calls.Load())
	}
}

// WithKey gives a request the caller's key, on every attempt.
func TestRoundTripperWithKey(t *testing.T) {
	t.Parallel()
	var keys []string
	tr := &idemhttp.RoundTripper{
		Sleep: noSleep,
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			keys = append(keys, r.Header.Get(idemhttp.HeaderKey))
			code := http.StatusCreated
			if len(keys) == 1 {
				code = http.StatusBadGateway
			}
			return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(""))}, nil
		}),
	}
	req, _ := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), "order-42-payment"), http.MethodPost,
		"http://example.invalid/pay", strings.NewReader("{}"))
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != "order-42-payment" || keys[1] != "order-42-payment" {
		t.Errorf("keys sent %q, want the caller's on both attempts", keys)
	}
}
