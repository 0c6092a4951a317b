package idemhttp_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// closeBody is a request body that says whether it was closed.
type closeBody struct {
	io.Reader
	closed bool
}

func (b *closeBody) Close() error { b.closed = true; return nil }

// A POST is given a key and retried when its body can be sent again: no
// body at all, http.NoBody, or a body with GetBody (each attempt sends it
// whole). One whose body cannot be sent again (no GetBody) passes through
// untouched: one attempt, no key. As http.RoundTripper requires, the
// caller's own body is closed: it is what the first attempt sends (later
// ones send GetBody's copies).
func TestRoundTripperProtectsOnlyRequestsItCanSendAgain(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		req       func() (*http.Request, *closeBody)
		protected bool
		body      string
	}{
		{"no body", func() (*http.Request, *closeBody) {
			r, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", nil)
			return r, nil
		}, true, ""},
		{"http.NoBody", func() (*http.Request, *closeBody) {
			r, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", http.NoBody)
			return r, nil
		}, true, ""},
		{"a body with GetBody", func() (*http.Request, *closeBody) {
			b := &closeBody{Reader: strings.NewReader(`{"amount":1}`)}
			r, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", b)
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(`{"amount":1}`)), nil }
			return r, b
		}, true, `{"amount":1}`},
		{"a body without GetBody", func() (*http.Request, *closeBody) {
			b := &closeBody{Reader: strings.NewReader(`{"amount":1}`)}
			r, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", b)
			return r, b
		}, false, `{"amount":1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var keys, bodies []string
			tr := &idemhttp.RoundTripper{Sleep: noSleep, Policy: idem.RetryPolicy{MaxAttempts: 3},
				Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
					var b []byte
					if r.Body != nil {
						b, _ = io.ReadAll(r.Body)
						r.Body.Close()
					}
					keys, bodies = append(keys, r.Header.Get(idemhttp.HeaderKey)), append(bodies, string(b))
					return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: http.NoBody}, nil
				})}
			req, own := c.req()
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("RoundTrip: %v, %v", resp, err)
			}
			wantAttempts := 1
			if c.protected {
				wantAttempts = 3
			}
			if len(keys) != wantAttempts || (keys[0] != "") != c.protected || slices.ContainsFunc(keys, func(k string) bool { return k != keys[0] }) {
				t.Errorf("attempts with the keys %q; want %d attempts, a key %t, the same on each", keys, wantAttempts, c.protected)
			}
			if slices.ContainsFunc(bodies, func(b string) bool { return b != c.body }) {
				t.Errorf("bodies sent %q; want %q on each attempt", bodies, c.body)
			}
			if own != nil && !own.closed {
				t.Error("the caller's body was not closed")
			}
		})
	}
}

// The waits between attempts grow from Policy.Base up to Policy.Cap, which
// is kept when set and is 5 s when left zero (not RetryPolicy's 30 s), as
// idemgrpc's Client's do; a Base longer than MaxRetryAfter is the client's
// own delay, waited in full (that bound is on what a server may ask).
func TestRoundTripperWaitsAtMostItsCap(t *testing.T) {
	t.Parallel()
	attempts := func(policy idem.RetryPolicy) []time.Duration {
		var sleeps []time.Duration
		tr := &idemhttp.RoundTripper{Policy: policy,
			Sleep: func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil },
			Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: http.NoBody}, nil
			})}
		req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", bytes.NewReader(nil))
		tr.RoundTrip(req)
		return sleeps
	}
	for _, c := range []struct{ cap, want time.Duration }{{0, 5 * time.Second}, {2 * time.Second, 2 * time.Second}} {
		var want []time.Duration
		for d := time.Second; len(want) < 5; d *= 2 {
			want = append(want, min(d, c.want))
		}
		if got := attempts(idem.RetryPolicy{MaxAttempts: 6, Base: time.Second, Cap: c.cap, Jitter: idem.NoJitter}); !slices.Equal(got, want) {
			t.Errorf("Policy.Cap %s: waits %v, want %v", c.cap, got, want)
		}
	}
	if got, want := attempts(idem.RetryPolicy{MaxAttempts: 2, Base: 2 * time.Minute, Jitter: idem.NoJitter}), []time.Duration{2 * time.Minute}; !slices.Equal(got, want) {
		t.Errorf("Policy.Base 2m: waits %v, want %v", got, want)
	}
}
