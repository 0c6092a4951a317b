package idemhttp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// RoundTripper is the client's half: an http.RoundTripper that gives every
// unsafe request an idempotency key and retries it safely.
//
// A request with a protected method and no Idempotency-Key header gets a
// fresh random key (a UUID v4); the same key is sent on every attempt, so
// the server runs the operation once however many attempts reach it. An
// attempt is retried when its outcome is unknown or transient: a network
// error (the request may or may not have arrived: the lost acknowledgement),
// 409 (still in flight), 425, 429, 500, 502, 503 and 504. Retry-After is
// honoured, in seconds or as an HTTP date, in full up to MaxRetryAfter
// (a 409's says when the holder's lease ends, which may be past
// Policy.Cap); no retry is
// started that could not begin before the request context's deadline; the
// delays are Policy's, with its Jitter (full jitter by default). Everything else, 422 included, is returned as
// it is. Requests without a protected method pass through untouched, as do
// requests whose body cannot be replayed (no GetBody).
type RoundTripper struct {
	// Base performs each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Policy bounds and spaces the attempts. Defaults to 4 attempts, 100ms
	// base, 5s cap, full jitter.
	Policy idem.RetryPolicy
	// Methods are those given keys and retried. Defaults to POST and PATCH.
	Methods []string
	// NewKey makes a key. Defaults to a random UUID v4.
	NewKey func() string
	// Sleep waits between attempts, returning early with ctx's error.
	// Defaults to a timer; tests inject one that does not wait.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now tells the time, to read a Retry-After given as an HTTP date and
	// to see whether a retry can still finish before the request's
	// deadline. Defaults to time.Now.
	Now func() time.Time
}

// MaxRetryAfter is the longest wait the clients (RoundTripper, and
// idemgrpc's Client) honour when a server asks for one (Retry-After, a
// RetryInfo), whatever their Policy.Cap: a server that asks for more gets
// a retry after MaxRetryAfter. A request's deadline bounds it further: no
// retry starts that could not begin before it.
const MaxRetryAfter = time.Minute

type keyContextKey struct{}

// WithKey returns a context whose requests, sent through a RoundTripper,
// carry key as their Idempotency-Key instead of a fresh one: for a key
// that must survive the process (kept with the operation it names, so
// that a retry after a restart is still the same operation). A request
// that sets the header itself keeps its own.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// WithCallName returns a context whose requests, sent through a
// RoundTripper, carry the downstream key of the call named name (and
// parts), as Execution.DownstreamKey derives it from the protected
// request ctx belongs to (keyed.DownstreamKey): every execution of that
// request (a retry after a transient failure, a takeover, a Completer's
// resume) sends the call with the same key, whatever order its calls are
// made in, so the service called replays what an earlier execution asked
// of it. Outside a protected request's handler it returns ctx as it is,
// and the request gets a fresh key. A request that sets the header itself
// keeps its own.
func WithCallName(ctx context.Context, name string, parts ...string) context.Context {
	key, ok := keyed.DownstreamKey(ctx, name, parts...)
	if !ok {
		return ctx
	}
	return WithKey(ctx, key)
}

// RoundTrip implements http.RoundTripper.
func (t *RoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if !t.protects(req.Method) || (req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
		return base.RoundTrip(req)
	}
	policy := t.Policy
	if policy.MaxAttempts == 0 {
		policy.MaxAttempts = 4
	}
	if policy.Cap == 0 {
		policy.Cap = 5 * time.Second
	}
	req = req.Clone(req.Context())
	if req.Header.Get(HeaderKey) == "" {
		key, _ := req.Context().Value(keyContextKey{}).(string)
		if key == "" {
			newKey := t.NewKey
			if newKey == nil {
				newKey = NewKey
			}
			key = newKey()
		}
		req.Header.Set(HeaderKey, key)
	}
	now := t.Now
	if now == nil {
		now = time.Now
	}
	ctx := req.Context()
	var prev time.Duration
	for attempt := 1; ; attempt++ {
		if attempt > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("idemhttp: replaying the request body: %w", err)
			}
			req.Body = body
		}
		resp, err := base.RoundTrip(req)
		retry, after := retryable(resp, err, now())
		if !retry || attempt >= policy.MaxAttempts || ctx.Err() != nil {
			return resp, err
		}
		delay := policy.Delay(attempt, prev)
		if after > 0 {
			// The server said when a retry can succeed (a duplicate's
			// 409: when the holder's lease ends): that is waited in
			// full, not cut to Policy.Cap, which bounds the client's
			// own delays; MaxRetryAfter bounds what a server may ask.
			delay = min(max(delay, after), max(policy.Cap, MaxRetryAfter))
		}
		if deadline, ok := ctx.Deadline(); ok && !now().Add(delay).Before(deadline) {
			// A retry could not even start before the deadline: the
			// caller gets this attempt's outcome rather than a
			// cancellation after a wait for nothing.
			return resp, err
		}
		prev = delay
		if resp != nil {
			// Drain a little so the connection can be reused, then close.
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		if err := t.sleep(ctx, delay); err != nil {
			return nil, err
		}
	}
}

func (t *RoundTripper) protects(method string) bool {
	methods := t.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, m := range methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

func (t *RoundTripper) sleep(ctx context.Context, d time.Duration) error {
	if t.Sleep != nil {
		return t.Sleep(ctx, d)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryable says whether an attempt's outcome calls for another attempt
// with the same key, and the delay the server asked for.
func retryable(resp *http.Response, err error, now time.Time) (bool, time.Duration) {
	if err != nil {
		// A cancelled or expired request is the caller's decision.
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded), 0
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return false, 0
	}
	// A 409 that is not about a request in flight is a real conflict.
	if resp.StatusCode == http.StatusConflict && resp.Header.Get("Retry-After") == "" {
		return false, 0
	}
	// Retry-After is delay-seconds or an HTTP date (RFC 9110, 10.2.3).
	ra := resp.Header.Get("Retry-After")
	if s, err := strconv.Atoi(ra); err == nil && s >= 0 {
		return true, time.Duration(s) * time.Second
	}
	if at, err := http.ParseTime(ra); err == nil {
		return true, max(at.Sub(now), 0)
	}
	return true, 0
}

// NewKey returns a random UUID v4, the usual idempotency key.
func NewKey() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s bytes.Buffer
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s.WriteByte('-')
		}
		fmt.Fprintf(&s, "%02x", c)
	}
	return s.String()
}
