package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// call is one protected call, as the engine's face (keyed.Face): the
// call, what its handler did, and what the interceptor returns.
type call struct {
	i       *Interceptor
	ctx     context.Context
	method  string
	req     any
	handler grpc.UnaryHandler

	// What the handler returned, and how it failed.
	resp  any
	err   error
	panic any // what it panicked with, raised again once the key is settled
	cs    *callStream
	// replayErr is why a kept answer could not be read.
	replayErr error

	// What the interceptor returns, and the panic it raises.
	out    any
	outErr error
	raise  any
}

// Run implements keyed.Face: it runs the handler with ctx, the
// Execution's (numbering the keys it passes on downstream), recording the
// metadata it sets.
func (c *call) Run(ctx context.Context, inTx bool) keyed.Ran {
	i := c.i
	ex, _ := keyed.ExecutionFromContext(ctx)
	hctx := context.WithValue(ctx, execKey{}, &execution{Execution: Execution{Scope: ex.Scope, Key: ex.Key, FullMethod: c.method,
		Token: ex.Token, ClaimedAt: ex.ClaimedAt, TookOver: ex.TookOver, Recovery: ex.Recovery, engine: ex}})
	if st := grpc.ServerTransportStreamFromContext(hctx); st != nil {
		c.cs = &callStream{ServerTransportStream: st}
		hctx = grpc.NewContextWithServerTransportStream(hctx, c.cs)
	}
	var failure string
	func() {
		defer func() {
			if v := recover(); v != nil {
				c.panic, failure = v, "panicked"
			}
		}()
		c.resp, c.err = c.handler(hctx, c.req)
	}()
	if failure == "" && c.err != nil && hctx.Err() != nil {
		// It gave up when its context ended (its time was up): nothing
		// says the effect is whole.
		failure = "timed out"
	}
	code := status.Code(c.err)
	ran := keyed.Ran{Status: HTTPStatus(code), Failure: failure}
	if failure == "" && i.cfg.Keep(c.method, code) {
		ran.Keep = true
		ran.Answer, ran.Overflow, ran.Err = i.keptAnswer(c.resp, c.err, c.cs, nil)
		if ran.Err == nil && c.err == nil {
			i.types.learn(c.method, c.resp)
		}
	}
	return ran
}

// Send implements keyed.Face: what the handler returned, its panic raised
// again.
func (c *call) Send() {
	c.out, c.outErr, c.raise = c.resp, c.err, c.panic
}

// Replay implements keyed.Face: the kept answer, as the type the method
// answers with, and its kept metadata.
func (c *call) Replay(kept *idem.Response) error {
	r, err := decodeAnswer(kept)
	var resp any
	if err == nil && r.code == codes.OK {
		resp, err = c.i.types.message(c.method, r.body)
	}
	if err != nil {
		c.replayErr = err
		return err
	}
	// A call made without a stream (a handler called directly, in a test)
	// has nowhere to put metadata; the answer is the same.
	_ = grpc.SetHeader(c.ctx, r.header)
	if r.trailer.Len() > 0 {
		_ = grpc.SetTrailer(c.ctx, r.trailer)
	}
	if r.code != codes.OK {
		c.outErr = r.err
		return nil
	}
	c.out = resp
	return nil
}

// Refuse implements keyed.Face: each refusal as a status, with its
// google.rpc.ErrorInfo reason (and a RetryInfo where the client may retry).
func (c *call) Refuse(rf keyed.Refusal) {
	retry := rf.RetryAfter
	switch rf.Reason {
	case keyed.RefusedMismatch:
		c.outErr = refusal(codes.FailedPrecondition, ReasonKeyMismatch,
			"this idempotency-key was already used with a different request (method or message); use a new key for a new operation", 0)
	case keyed.RefusedInFlight:
		if err := c.ctx.Err(); err != nil {
			c.outErr = status.FromContextError(err).Err()
			return
		}
		c.outErr = refusal(codes.Aborted, ReasonInFlight,
			"a call with this idempotency-key is still being processed; retry later with the same key to get its result", retry)
	case keyed.RefusedStoreUnavailable:
		c.outErr = refusal(codes.Unavailable, ReasonStoreUnavailable,
			"the call was not run, because its idempotency key could not be claimed; retry with the same key", retry)
	case keyed.RefusedCommitFailed:
		c.outErr = refusal(codes.Unavailable, ReasonStoreUnavailable, "the call could not be committed and was rolled back; retry with the same key", retry)
	case keyed.RefusedLeaseLost:
		c.outErr = refusal(codes.Unavailable, ReasonLeaseLost,
			"this execution took longer than its lease and another took over the key; its effect was rolled back; retry with the same key to get the result", retry)
	case keyed.RefusedHandlerFailed, keyed.RefusedUnfinished:
		// What the handler returned, or its panic, for the interceptors
		// before this one (a recoverer) to answer as they would.
		c.Send()
	case keyed.RefusedTooLarge:
		c.i.log.LogAttrs(c.ctx, slog.LevelWarn, "answer too large to keep: call rolled back", slog.String("method", c.method),
			slog.Int("max_response_bytes", c.i.cfg.MaxResponseBytes))
		c.outErr = refusal(codes.Internal, ReasonResponseTooLarge,
			fmt.Sprintf("the answer exceeded %d bytes, the most that is kept for replay, so the call was rolled back", c.i.cfg.MaxResponseBytes), 0)
	case keyed.RefusedUnkeepable:
		c.outErr = status.Error(codes.Internal, "the answer could not be kept, so the call was rolled back")
	case keyed.RefusedUnreadable:
		c.outErr = c.replayErr
		if c.outErr == nil {
			c.outErr = errUnreadable
		}
	default:
		c.outErr = refusal(codes.Unavailable, ReasonStoreUnavailable, "the call was not run; retry with the same key", time.Second)
	}
}

// errNotMessage is keptAnswer's refusal of a response that is not a
// protocol buffer message.
var errNotMessage = errors.New("idemgrpc: the response is not a protocol buffer message")
