package demo

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
)

// The client's retry policy: that of a careful payment client, scaled down
// so that the whole demo runs in seconds. Cap also caps the server's
// Retry-After, which a real client would honour as given.
var retryPolicy = idem.RetryPolicy{MaxAttempts: 6, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond}

// requestTimeout bounds one request, retries included, so a hung server
// fails the demo instead of hanging it.
const requestTimeout = 10 * time.Second

// faultHeader is the payment service's fault-injection request header.
const faultHeader = payments.HeaderFault

// client talks to one payment service as one tenant.
type client struct {
	base   string // "http://127.0.0.1:PORT"
	apiKey string
	// once sends exactly one attempt per request: for the demo's own setup
	// and measurements.
	once *http.Client
	// retrying is the client every customer uses: idemhttp's Transport,
	// which resends a request under the same Idempotency-Key after a
	// network error or a "try again" answer, with jittered backoff.
	retrying *http.Client
	conns    *http.Transport
}

func newClient(base, apiKey string) *client {
	// Keep-alives off: net/http itself silently resends a request that
	// carries an Idempotency-Key when a reused connection breaks, which
	// would hide attempts from the count. One connection per attempt makes
	// every attempt counted exactly one request the service received.
	conns := &http.Transport{DisableKeepAlives: true}
	return &client{
		base:   base,
		apiKey: apiKey,
		once:   &http.Client{Timeout: requestTimeout, Transport: conns},
		retrying: &http.Client{Timeout: requestTimeout, Transport: &idemhttp.RoundTripper{
			Base:   &attemptTransport{base: conns},
			Policy: retryPolicy,
		}},
		conns: conns,
	}
}

func (c *client) close() { c.conns.CloseIdleConnections() }

// attempts follows one intended request through its retries: how many
// attempts went out, and the fault to ask for on the first one only (a
// fault injected on every attempt would never let the retry succeed).
type attempts struct {
	firstFault string
	n          atomic.Int64
}

type attemptsKey struct{}

// attemptTransport sits below the retrying transport, so it sees every
// attempt: it counts them and adds the first attempt's fault.
type attemptTransport struct{ base http.RoundTripper }

func (t *attemptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if a, ok := req.Context().Value(attemptsKey{}).(*attempts); ok {
		if a.n.Add(1) == 1 && a.firstFault != "" {
			req = req.Clone(req.Context())
			req.Header.Set(faultHeader, a.firstFault)
		}
	}
	return t.base.RoundTrip(req)
}

// reply is one answer from the service.
type reply struct {
	status int
	body   []byte
}

func (c *client) newRequest(ctx context.Context, method, path, key string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		// A bytes.Reader gives the request a GetBody, so the retrying
		// transport can send the body again.
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	return req, nil
}

func do(hc *http.Client, req *http.Request) (*reply, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &reply{status: resp.StatusCode, body: b}, nil
}

// call makes one request that must succeed with want, decoding the answer
// into out. It is for the demo's own setup and measurements, not for the
// payments under test.
func (c *client) call(ctx context.Context, method, path, key string, body any, want int, out any) error {
	req, err := c.newRequest(ctx, method, path, key, body)
	if err != nil {
		return err
	}
	r, err := do(c.once, req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if r.status != want {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, r.status, want, snippet(r.body))
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}

// outcome is what a retrying client ended with.
type outcome struct {
	attempts int
	status   int    // the final answer's status; 0 when none came
	body     []byte // the final answer's body
	err      error  // why no answer came
}

// post sends one intended request under one idempotency key through the
// retrying client; firstFault, when set, goes on the first attempt only.
func (c *client) post(ctx context.Context, path, key, firstFault string, body any) outcome {
	a := &attempts{firstFault: firstFault}
	req, err := c.newRequest(context.WithValue(ctx, attemptsKey{}, a), http.MethodPost, path, key, body)
	if err != nil {
		return outcome{err: err}
	}
	r, err := do(c.retrying, req)
	out := outcome{attempts: int(a.n.Load()), err: err}
	if r != nil {
		out.status, out.body = r.status, r.body
	}
	return out
}

// sleep waits d or until ctx is done. It simulates a person who waits; the
// demo never sleeps to wait for the service to reach some state.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newIdempotencyKey returns a random version 4 UUID, the key a client makes
// once per intended payment.
func newIdempotencyKey() string {
	var b [16]byte
	crand.Read(b[:]) // never fails: crypto/rand panics rather than return short
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// newAPIKey returns a random bearer key for the demo's one tenant.
func newAPIKey() string { return "demo_" + crand.Text() }

// snippet shortens a body for an error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}
