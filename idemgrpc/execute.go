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
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/keywait"
)

// run is one run of the handler: what it returned, and how it failed.
type run struct {
	resp    any
	err     error
	panic   any    // what it panicked with, re-raised once the key is settled
	failure string // "panicked", "timed out": a failure that keeps nothing
	cs      *callStream
	// kept is what the run completed with; keepErr why it could not be kept.
	kept    idem.Response
	keepErr error
	// fp and expires are the request's fingerprint and its record's
	// expiry, for the memory of recent keys.
	fp      idem.Fingerprint
	expires time.Time
}

// handlerContext is the context the handler runs with: the phase's, with
// the Execution, a deadline inside the lease, and the stream that records
// the metadata it sets. parent is not cancelled with the call: a caller
// whose deadline passed, or whose connection dropped, retries, and the
// retry should find the answer kept rather than a run cut off half-way
// (in the same-transaction forms, rolled back) and run it all again.
func (c *call) handlerContext(parent context.Context, ex Execution, r *run) (context.Context, context.CancelFunc) {
	ctx := context.WithValue(c.begin(parent, idemhttp.PhaseHandler), execKey{}, &execution{Execution: ex})
	ctx, cancel := context.WithTimeout(ctx, c.i.cfg.Lease*9/10)
	if st := grpc.ServerTransportStreamFromContext(ctx); st != nil {
		r.cs = &callStream{ServerTransportStream: st}
		ctx = grpc.NewContextWithServerTransportStream(ctx, r.cs)
	}
	return ctx, cancel
}

// runHandler runs the handler with hctx and classifies its outcome.
func (c *call) runHandler(hctx context.Context, req any, handler grpc.UnaryHandler, r *run) {
	func() {
		defer func() {
			if v := recover(); v != nil {
				r.panic, r.failure = v, "panicked"
			}
		}()
		r.resp, r.err = handler(hctx, req)
	}()
	if r.failure == "" && r.err != nil && hctx.Err() != nil {
		// It gave up when its context ended (the lease's share of time,
		// or the client gone): nothing says the effect is whole.
		r.failure = "timed out"
	}
	code := status.Code(r.err)
	c.end(idemhttp.PhaseHandler, idemhttp.Event{Status: HTTPStatus(code), Err: failureErr(r.failure)})
}

// keeps says whether r's answer is kept.
func (c *call) keeps(r *run) bool {
	return r.failure == "" && c.i.cfg.Keep(c.method, status.Code(r.err))
}

// execute runs the handler for a key a claim acquired and answers, in the
// separate form or inside the store's CompleteTx; duplicates of the key
// waiting in this process are told when it ends.
func (c *call) execute(req any, handler grpc.UnaryHandler, ex Execution, fp idem.Fingerprint, expires time.Time) (any, error) {
	i := c.i
	ref := idem.Ref{Scope: ex.Scope, Key: ex.Key, Token: ex.Token}
	defer i.local.Notify(keywait.Key{Scope: ref.Scope, Key: ref.Key})
	r := &run{fp: fp, expires: expires}
	hctx, cancel := c.handlerContext(context.WithoutCancel(c.ctx), ex, r)
	defer cancel()
	if i.txStore != nil {
		c.markStore()
		kept, err := i.txStore.CompleteTx(hctx, ref, func(txctx context.Context) (idem.Response, bool, error) {
			return c.runInTx(txctx, req, handler, r)
		})
		return c.finishTx(ref, r, kept, err, false)
	}
	c.runHandler(hctx, req, handler, r)
	if !c.keeps(r) {
		c.release(ref, r)
		return c.answer(r)
	}
	c.begin(c.ctx, idemhttp.PhaseComplete)
	kept, err := i.keptAnswer(r.resp, r.err, r.cs, true)
	if err == nil {
		dctx, dcancel := detached(c.ctx)
		c.markStore()
		err = i.store.Complete(dctx, ref, kept)
		c.storeSince(idemhttp.StoreComplete, err)
		dcancel()
	}
	c.end(idemhttp.PhaseComplete, idemhttp.Event{Err: err})
	code := status.Code(r.err)
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		c.tally(idemhttp.OutcomeLeaseLost)
		c.log.LogAttrs(c.ctx, slog.LevelWarn, "completion refused: the lease was lost while the handler ran; another execution may have run too",
			slog.String("code", code.String()), slog.Duration("lease", i.cfg.Lease))
	case err != nil:
		c.tally(idemhttp.OutcomeStoreError)
		c.log.LogAttrs(c.ctx, slog.LevelError, "could not keep the answer; the key stays in flight until its lease ends",
			slog.String("code", code.String()), slog.String("error", err.Error()))
	default:
		i.types.learn(c.method, r.resp)
		i.recent.Keep(keywait.Key{Scope: ref.Scope, Key: ref.Key}, fp, &kept, expires)
		c.tally(idemhttp.OutcomeExecuted)
	}
	// The effect has happened, kept or not: its caller gets its answer.
	return r.resp, r.err
}

// answer returns what the handler returned, re-raising its panic.
func (c *call) answer(r *run) (any, error) {
	if r.panic != nil {
		panic(r.panic)
	}
	return r.resp, r.err
}

// runInTx is the work of CompleteTx and ClaimTx: the handler, with txctx
// (which carries the transaction), and what to keep of it.
func (c *call) runInTx(txctx context.Context, req any, handler grpc.UnaryHandler, r *run) (idem.Response, bool, error) {
	c.runHandler(txctx, req, handler, r)
	c.begin(c.ctx, idemhttp.PhaseComplete)
	c.markStore()
	if !c.keeps(r) {
		return idem.Response{}, false, nil
	}
	kept, err := c.i.keptAnswer(r.resp, r.err, r.cs, false)
	if err != nil {
		r.keepErr = err
		return idem.Response{}, false, nil
	}
	r.kept = kept
	return kept, true, nil
}

// claimInTx claims the key in the transaction the handler runs in
// (TxClaimer.ClaimTx). A duplicate of a key this process is executing
// waits at the key's gate rather than in the store, holding none of its
// connections; one with another fingerprint is refused at once. answered
// says that it answered the call (resp, err); otherwise the caller answers
// by the claim, or by err.
func (c *call) claimInTx(req any, handler grpc.UnaryHandler, creq idem.ClaimRequest, deadline time.Time) (claim idem.Claim, answered bool, resp any, err error) {
	i := c.i
	wk := keywait.Key{Scope: creq.Scope, Key: creq.Key}
	for {
		ended, fp, done := i.gates.Executing(wk)
		if ended == nil {
			break
		}
		if fp != creq.Fingerprint {
			done()
			return idem.Claim{}, true, nil, c.refuseMismatch(idem.StateInFlight)
		}
		ok := waitGate(c.ctx, ended, deadline)
		done()
		if !ok {
			return idem.Claim{}, true, nil, c.inFlightTooLong()
		}
	}
	r := &run{fp: creq.Fingerprint}
	var cancel context.CancelFunc
	endGate := func() {}
	defer func() {
		endGate() // after the commit or rollback, also when the handler panics
		if cancel != nil {
			cancel()
		}
	}()
	c.markStore()
	// The transaction outlives the caller (see Config.Lease): an answer
	// the caller did not wait for is kept for its retry.
	claim, kept, err := i.txClaimer.ClaimTx(context.WithoutCancel(c.ctx), creq, max(time.Until(deadline), time.Millisecond), func(txctx context.Context, cl idem.Claim) (idem.Response, bool, error) {
		c.storeSince(idemhttp.StoreClaim, nil)
		c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimAcquired, TookOver: cl.TookOver})
		endGate = i.gates.Begin(wk, creq.Fingerprint)
		r.expires = cl.Record.ExpiresAt
		if cl.TookOver {
			c.log.LogAttrs(c.ctx, slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(cl.Token)))
		}
		var hctx context.Context
		hctx, cancel = c.handlerContext(txctx, Execution{Scope: creq.Scope, Key: creq.Key, FullMethod: c.method, Token: cl.Token,
			ClaimedAt: cl.Record.CreatedAt, TookOver: cl.TookOver}, r)
		return c.runInTx(hctx, req, handler, r)
	})
	if claim.Outcome != idem.Acquired {
		c.storeSince(idemhttp.StoreClaim, err)
		return claim, false, nil, err
	}
	ref := idem.Ref{Scope: creq.Scope, Key: creq.Key, Token: claim.Token}
	defer i.local.Notify(wk)
	// A fresh claim that is not kept was rolled back with everything else;
	// a key taken over must still be released.
	resp, err = c.finishTx(ref, r, kept, err, !claim.TookOver)
	return claim, true, resp, err
}

// finishTx answers once the handler ran in a store's transaction.
// rolledBack says that a rollback leaves the key free, with nothing to
// release.
func (c *call) finishTx(ref idem.Ref, r *run, kept bool, err error, rolledBack bool) (any, error) {
	i := c.i
	c.end(idemhttp.PhaseHandler, idemhttp.Event{Err: err}) // when the transaction failed before the handler ran
	c.storeSince(idemhttp.StoreComplete, err)
	if err != nil || kept || rolledBack {
		c.end(idemhttp.PhaseComplete, idemhttp.Event{Err: err}) // otherwise release ends it
	}
	switch {
	case err == nil && kept:
		i.types.learn(c.method, r.resp)
		i.recent.Keep(keywait.Key{Scope: ref.Scope, Key: ref.Key}, r.fp, &r.kept, r.expires)
		c.tally(idemhttp.OutcomeExecuted)
		return r.resp, r.err
	case err == nil:
		if rolledBack {
			c.released(r)
		} else {
			c.release(ref, r)
		}
		switch {
		case errors.Is(r.keepErr, errTooLarge):
			c.log.LogAttrs(c.ctx, slog.LevelWarn, "answer too large to keep: call rolled back", slog.Int("max_response_bytes", i.cfg.MaxResponseBytes))
			return nil, refusal(codes.Internal, ReasonResponseTooLarge,
				fmt.Sprintf("the answer exceeded %d bytes, the most that is kept for replay, so the call was rolled back", i.cfg.MaxResponseBytes), 0)
		case r.keepErr != nil:
			c.log.LogAttrs(c.ctx, slog.LevelError, "answer cannot be kept: call rolled back", slog.String("error", r.keepErr.Error()))
			return nil, status.Error(codes.Internal, "the answer could not be kept, so the call was rolled back")
		}
		return c.answer(r)
	case errors.Is(err, idem.ErrLeaseLost):
		c.tally(idemhttp.OutcomeLeaseLost)
		c.log.LogAttrs(c.ctx, slog.LevelWarn, "completion refused: the lease was lost while the handler ran; its effect was rolled back",
			slog.Duration("lease", i.cfg.Lease))
		return nil, refusal(codes.Unavailable, ReasonLeaseLost,
			"this execution took longer than its lease and another took over the key; its effect was rolled back; retry with the same key to get the result", time.Second)
	}
	// Neither the handler's error nor a fencing refusal: the commit may or
	// may not have happened. Only a key provably not completed by this
	// execution is released.
	dctx, cancel := detached(c.ctx)
	defer cancel()
	rec, gerr := i.store.Get(dctx, ref.Scope, ref.Key)
	if gerr == nil && rec.State == idem.StateCompleted && rec.Token == ref.Token {
		c.tally(idemhttp.OutcomeExecuted)
		c.log.LogAttrs(c.ctx, slog.LevelWarn, "commit reported an error but did commit", slog.String("error", err.Error()))
		return r.resp, r.err
	}
	c.tally(idemhttp.OutcomeStoreError)
	if gerr == nil && rec.State == idem.StateInFlight && rec.Token == ref.Token {
		if rerr := i.store.Release(dctx, ref); rerr != nil && !errors.Is(rerr, idem.ErrLeaseLost) {
			c.log.LogAttrs(c.ctx, slog.LevelError, "could not release the key; it frees itself when its lease ends", slog.String("error", rerr.Error()))
		}
	}
	c.log.LogAttrs(c.ctx, slog.LevelError, "commit failed; nothing was kept", slog.String("error", err.Error()))
	return nil, refusal(codes.Unavailable, ReasonStoreUnavailable, "the call could not be committed and was rolled back; retry with the same key", time.Second)
}

// release gives the key up after a transient failure.
func (c *call) release(ref idem.Ref, r *run) {
	dctx, cancel := detached(c.ctx)
	defer cancel()
	c.begin(c.ctx, idemhttp.PhaseComplete)
	c.markStore()
	err := c.i.store.Release(dctx, ref)
	c.storeSince(idemhttp.StoreRelease, err)
	c.end(idemhttp.PhaseComplete, idemhttp.Event{Err: err})
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		c.tally(idemhttp.OutcomeLeaseLost)
		c.log.LogAttrs(c.ctx, slog.LevelWarn, "release refused: the lease was lost while the handler ran")
	case err != nil:
		c.tally(idemhttp.OutcomeStoreError)
		c.log.LogAttrs(c.ctx, slog.LevelError, "could not release the key; it frees itself when its lease ends", slog.String("error", err.Error()))
	default:
		c.released(r)
	}
}

func (c *call) released(r *run) {
	c.tally(idemhttp.OutcomeReleased)
	attrs := []slog.Attr{slog.String("code", status.Code(r.err).String())}
	if r.failure != "" {
		attrs = append(attrs, slog.String("failure", r.failure))
	}
	c.log.LogAttrs(c.ctx, slog.LevelInfo, "transient failure: key released so a retry runs again", attrs...)
}

// answerFromRecord answers a duplicate of a key seen completed lately
// from the key's record, read without claiming it, and reports whether it
// did: a completed record is replayed, one with another fingerprint
// refused. Anything else (the key gone, in flight again after it expired,
// the store failing) is left to the claim.
func (c *call) answerFromRecord(creq idem.ClaimRequest) (answered bool, resp any, err error) {
	i := c.i
	c.begin(c.ctx, idemhttp.PhaseReplay)
	defer c.end(idemhttp.PhaseReplay, idemhttp.Event{}) // when the claim is left to answer
	c.markStore()
	if i.replayer != nil {
		kept, mismatch, rerr := i.replayer.Replay(c.ctx, creq.Scope, creq.Key, creq.Fingerprint)
		c.storeSince(idemhttp.StoreReplay, rerr)
		switch {
		case rerr != nil || (!mismatch && kept == nil):
			return false, nil, nil
		case mismatch:
			return true, nil, c.refuseMismatch(idem.StateCompleted)
		}
		resp, err = c.replay(kept)
		return true, resp, err
	}
	rec, gerr := i.store.Get(c.ctx, creq.Scope, creq.Key)
	c.storeSince(idemhttp.StoreGet, gerr)
	switch {
	case gerr != nil:
		return false, nil, nil
	case rec.Fingerprint != creq.Fingerprint:
		return true, nil, c.refuseMismatch(rec.State)
	case rec.State != idem.StateCompleted || rec.Response == nil:
		return false, nil, nil
	}
	i.recent.Keep(keywait.Key{Scope: creq.Scope, Key: creq.Key}, rec.Fingerprint, rec.Response, rec.ExpiresAt)
	resp, err = c.replay(rec.Response)
	return true, resp, err
}

// replay answers a duplicate with the key's kept answer.
func (c *call) replay(kept *idem.Response) (any, error) {
	c.begin(c.ctx, idemhttp.PhaseReplay)
	r, err := decodeAnswer(kept)
	var resp any
	if err == nil && r.code == codes.OK {
		resp, err = c.i.types.message(c.method, r.body)
	}
	if err != nil {
		// The effect happened and its answer is kept: running again would
		// repeat it, so the duplicate is refused instead.
		c.tally(idemhttp.OutcomeStoreError)
		c.end(idemhttp.PhaseReplay, idemhttp.Event{Status: 500})
		c.log.LogAttrs(c.ctx, slog.LevelError, "kept answer unreadable: duplicate refused", slog.String("error", err.Error()))
		return nil, err
	}
	// A call made without a stream (a handler called directly, in a test)
	// has nowhere to put metadata; the answer is the same.
	_ = grpc.SetHeader(c.ctx, r.header)
	if r.trailer.Len() > 0 {
		_ = grpc.SetTrailer(c.ctx, r.trailer)
	}
	c.tally(idemhttp.OutcomeReplayed)
	c.end(idemhttp.PhaseReplay, idemhttp.Event{Status: HTTPStatus(r.code)})
	if r.code != codes.OK {
		return nil, r.err
	}
	return resp, nil
}

func (c *call) refuseMismatch(state idem.State) error {
	c.tally(idemhttp.OutcomeMismatch)
	c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimMismatch})
	c.log.LogAttrs(c.ctx, slog.LevelInfo, "idempotency key reused with a different request", slog.String("state", state.String()))
	return refusal(codes.FailedPrecondition, ReasonKeyMismatch,
		"this idempotency-key was already used with a different request (method or message); use a new key for a new operation", 0)
}

// inFlightTooLong answers a duplicate that waited as long as it may.
func (c *call) inFlightTooLong() error {
	c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimInFlight, Err: c.ctx.Err()})
	if err := c.ctx.Err(); err != nil {
		c.tally(idemhttp.OutcomeConflict)
		return status.FromContextError(err).Err()
	}
	c.tally(idemhttp.OutcomeConflict)
	c.log.LogAttrs(c.ctx, slog.LevelInfo, "duplicate still in flight after waiting")
	return refusal(codes.Aborted, ReasonInFlight,
		"a call with this idempotency-key is still being processed; retry later with the same key to get its result", time.Second)
}

// waitGate waits until the execution held at the key's gate ends (true),
// or the deadline passes or the caller goes away (false).
func waitGate(ctx context.Context, ended <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ended:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// waitChange blocks until the key may have changed, the poll interval
// passes, the deadline passes or the caller goes away; false says to stop
// waiting.
func (c *call) waitChange(wk keywait.Key, changed <-chan struct{}, deadline time.Time, attempt int) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	// Ask again soon at first (most calls finish quickly), then back off.
	step := min(10*time.Millisecond<<min(attempt, 5), c.i.cfg.PollInterval, left)
	t := time.NewTimer(step)
	defer t.Stop()
	var storeSignal <-chan struct{}
	if c.i.waiter != nil {
		wctx, cancel := context.WithCancel(c.ctx)
		done := make(chan struct{})
		storeSignal = done
		go func() {
			defer close(done)
			c.i.waiter.WaitChange(wctx, wk.Scope, wk.Key)
		}()
		defer func() { cancel(); <-done }()
	}
	select {
	case <-changed:
	case <-storeSignal:
	case <-t.C:
	case <-c.ctx.Done():
		return false
	}
	return true
}

// callLog logs about one protected call; the call's own attributes are
// made only for records that are logged.
type callLog struct {
	l      *slog.Logger
	scope  idem.Scope
	key    idem.Key
	method string
}

func (cl callLog) LogAttrs(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if !cl.l.Enabled(ctx, level) {
		return
	}
	all := make([]slog.Attr, 0, len(attrs)+3)
	all = append(all, slog.Any("scope", cl.scope), slog.String("key", idem.KeyDigest(cl.scope, cl.key)), slog.String("method", cl.method))
	cl.l.LogAttrs(ctx, level, msg, append(all, attrs...)...)
}
