package idemgrpc

import (
	"cmp"
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Client is the client's half: it gives every unary call an idempotency
// key and retries it safely. Install it with
// grpc.WithChainUnaryInterceptor(client.Unary()).
//
// The key of a call is, in order: the idempotency-key already in its
// outgoing metadata; the one WithKey or WithCallName put in its context;
// inside a handler the Interceptor protects, a key derived from that
// execution's, numbered by the order of its calls to the method
// (DownstreamKey); otherwise a fresh one (a UUID v4). A server calling
// further services so passes its key on, and a re-execution of it sends
// the same keys again, provided that it makes its calls in the same order:
// a handler that makes calls concurrently names each (WithCallName), since
// goroutines start in another order each time. The same key goes with every attempt: gRPC's own
// retries (a retryPolicy in the service config) resend the call's
// metadata, and the Client's own retries reuse it.
//
// The Client retries an attempt whose outcome is unknown or transient:
// Unavailable (the request may or may not have arrived: a lost answer),
// Aborted (the Interceptor's answer to a duplicate still in flight) and
// ResourceExhausted with a google.rpc.RetryInfo. A RetryInfo's delay is
// honoured in full, up to idemhttp.MaxRetryAfter (an Aborted duplicate's
// says when the holder's lease ends, which may be past Policy.Cap);
// otherwise the delays are Policy's, with its
// jitter. No retry is started that could not begin before the call's
// deadline. Everything else is returned as it is.
//
// Those retries are safe against a service that de-duplicates by key (an
// Interceptor, or idemhttp behind a gateway): against one that does not, a
// retry after a lost answer runs the call again. Give such methods the
// policy Off.
type Client struct {
	// Policy bounds and spaces the attempts. Defaults to 4 attempts, 100ms
	// base, 5s cap, full jitter.
	Policy idem.RetryPolicy
	// Methods sets the policy of single methods or services, as
	// Config.Methods does: Off sends the call untouched (no key, no
	// retries). Defaults to none. A name of neither form
	// ("/payments.v1.Payments.Create", "/payments.v1.Payments/"), which no
	// call could match, or an entry that is no Policy, makes every call
	// fail, before any attempt, with an error (idem.ErrInvalidArgument)
	// naming the entry: the Client has no constructor to refuse it.
	Methods map[string]Policy
	// Default is the policy of the other methods. Defaults to Required
	// (a key for every call), except for the health and reflection
	// services and methods whose registered descriptor declares
	// idempotency_level NO_SIDE_EFFECTS or IDEMPOTENT, which are Off (as
	// Config.Default says). A value that is no Policy makes every call
	// fail, before any attempt, with an error (idem.ErrInvalidArgument).
	Default Policy
	// NewKey makes a key. Defaults to idemhttp.NewKey, a random UUID v4.
	NewKey func() string
	// Sleep waits between attempts, returning early with ctx's error.
	// Defaults to a timer; tests inject one that does not wait.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now tells the time, to see whether a retry can still begin before
	// the call's deadline. Defaults to time.Now.
	Now func() time.Time

	policies sync.Map
	checked  sync.Once
	invalid  error // checkDefault's and checkMethods' verdict, read once
}

// Unary returns the unary client interceptor.
func (c *Client) Unary() grpc.UnaryClientInterceptor {
	return c.invoke
}

func (c *Client) policy(fullMethod string) Policy {
	if p, ok := c.policies.Load(fullMethod); ok {
		return p.(Policy)
	}
	p := resolvePolicy(c.Methods, c.Default, fullMethod)
	c.policies.Store(fullMethod, p)
	return p
}

func (c *Client) invoke(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.checked.Do(func() {
		c.invalid = cmp.Or(checkDefault("idemgrpc.Client.Default", c.Default), checkMethods("idemgrpc.Client.Methods", c.Methods))
	})
	if c.invalid != nil {
		return c.invalid
	}
	if c.policy(method) == Off {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(MetadataKey)) == 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, c.keyFor(ctx, method))
	}
	policy := c.Policy
	if policy.MaxAttempts == 0 {
		policy.MaxAttempts = 4
	}
	if policy.Cap == 0 {
		policy.Cap = 5 * time.Second
	}
	now := c.Now
	if now == nil {
		now = time.Now
	}
	var prev time.Duration
	for attempt := 1; ; attempt++ {
		err := invoker(ctx, method, req, reply, cc, opts...)
		retry, after := retryable(err)
		if !retry || attempt >= policy.MaxAttempts || ctx.Err() != nil {
			return err
		}
		delay := policy.Delay(attempt, prev)
		if after > 0 {
			// The server said when a retry can succeed (an Aborted
			// duplicate: when the holder's lease ends): that is waited in
			// full, not cut to Policy.Cap, which bounds the client's own
			// delays; idemhttp.MaxRetryAfter bounds what a server may ask.
			delay = min(max(delay, after), max(policy.Cap, idemhttp.MaxRetryAfter))
		}
		if deadline, ok := ctx.Deadline(); ok && !now().Add(delay).Before(deadline) {
			// A retry could not even begin before the deadline: the caller
			// gets this attempt's outcome rather than a wait for nothing.
			return err
		}
		prev = delay
		if serr := c.sleep(ctx, delay); serr != nil {
			return err
		}
	}
}

// keyFor is the key of a call that brought none in its metadata.
func (c *Client) keyFor(ctx context.Context, method string) string {
	if key, _ := ctx.Value(keyContextKey{}).(string); key != "" {
		return key
	}
	if e, ok := ctx.Value(execKey{}).(*execution); ok {
		return e.nextKey(method)
	}
	if c.NewKey != nil {
		return c.NewKey()
	}
	return idemhttp.NewKey()
}

func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	if c.Sleep != nil {
		return c.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryable says whether an attempt's outcome calls for another attempt
// with the same key, and the delay the server asked for.
func retryable(err error) (bool, time.Duration) {
	if err == nil {
		return false, 0
	}
	st, ok := status.FromError(err)
	if !ok {
		return false, 0
	}
	after, hasInfo := retryDelay(st)
	switch st.Code() {
	case codes.Unavailable, codes.Aborted:
		return true, after
	case codes.ResourceExhausted:
		return hasInfo, after
	}
	return false, 0
}
