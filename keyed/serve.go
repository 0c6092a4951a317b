package keyed

import (
	"context"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

// call is one request the engine serves: what Serve knows of it.
type call struct {
	e    *Engine
	ctx  context.Context // the request's, or Begin's when observed
	face Face
	log  reqLog
	req  idem.ClaimRequest
	// clientKey is the key as the client sent it, before sealing: what
	// the request's downstream keys derive from.
	clientKey idem.Key
	wk        keywait.Key
	// deadline is when a duplicate stops waiting for an execution in
	// flight: Config.InflightWait, or the caller's deadline if sooner.
	deadline time.Time
	outcome  Outcome
}

func (c *call) tally(o Outcome) {
	c.outcome = o
	c.e.tally(c.ctx, o)
}

// Serve runs one request under its key and answers it through face: the
// kept answer replayed, the handler run once and its answer kept (or the
// key released after a transient failure), or a refusal; and returns how
// it ended. ctx is the request's (Begin's, when observed): its values reach
// the handler, its cancellation ends a duplicate's wait but never the
// handler, whose answer is then kept for the client's retry. The handler's
// own context ends when its time is up.
func (e *Engine) Serve(ctx context.Context, req Request, face Face) Outcome {
	key := e.seal(req.Scope, req.Key)
	c := call{e: e, ctx: ctx, face: face, clientKey: req.Key,
		log: reqLog{l: e.log, scope: req.Scope, key: key, method: req.Method, path: req.Path},
		req: idem.ClaimRequest{Scope: req.Scope, Key: key, Fingerprint: req.Fingerprint, Lease: e.cfg.Lease, TTL: e.cfg.TTL, Holder: e.cfg.Holder},
		wk:  keywait.Key{Scope: req.Scope, Key: key}}
	e.noteKey(ctx, req.Scope, key)
	switch resp, seen := e.recent.Lookup(c.wk, req.Fingerprint); {
	case resp != nil:
		c.replay(resp)
		return c.outcome
	case !seen:
		c.req.Unseen = true
	case c.answerFromRecord():
		return c.outcome
	}
	c.deadline = time.Now().Add(e.cfg.InflightWait)
	if d, ok := ctx.Deadline(); ok && d.Before(c.deadline) {
		c.deadline = d
	}
	x := &execution{call: c}
	x.claimKey()
	return x.outcome
}

// claimKey claims the key, waiting for an execution of it in flight, and
// answers: a replay, a refusal, or the handler run under the key.
func (x *execution) claimKey() {
	c, e := &x.call, x.call.e
	ctx := c.ctx
	// A duplicate watches for this process's own completion of the key,
	// but only once it has seen the key in flight: a first execution pays
	// nothing for it. The watch ends when claim returns, or before the
	// handler runs once the key is this request's.
	watch := &x.watch
	defer watch.stop()
	waits := 0
	e.beginPhase(ctx, PhaseClaim)
	for {
		var claim idem.Claim
		var answered bool
		var err error
		if e.txClaimer != nil {
			claim, answered, err = x.claimInTx()
			if answered {
				return
			}
		} else {
			e.markStore(ctx)
			x.sent = e.cfg.Clock.Now()
			claim, err = e.store.Claim(ctx, c.req)
			e.storeSince(ctx, StoreClaim, err)
		}
		if err != nil && (ctx.Err() != nil || watch.watching() && callerLeft(ctx) != nil) {
			// The caller left while its claim waited in the store (behind
			// the execution of the key in flight, say): as a duplicate
			// whose caller left while it waited here. A store's client
			// that sets its connection's deadline from the context's
			// fails the claim at the deadline, when the context itself
			// may not say yet that it ended: for a duplicate that has
			// seen the key in flight, that is the caller leaving too, not
			// the store failing. A claim that never reached the store's
			// answer (an unreachable store failing at the caller's
			// deadline) stays a store error below, counted and logged, so
			// an outage does not hide among conflicts.
			c.inFlightTooLong(x.leaseEnds)
			return
		}
		if err != nil {
			e.endPhase(ctx, PhaseClaim, Event{Claim: ClaimError, Err: err})
			c.tally(OutcomeStoreError)
			c.log.LogAttrs(ctx, slog.LevelError, "idempotency store unavailable: request refused", slog.String("error", err.Error()))
			c.face.Refuse(Refusal{Reason: RefusedStoreUnavailable, RetryAfter: time.Second, Err: err})
			return
		}
		switch claim.Outcome {
		case idem.Mismatch:
			c.refuseMismatch(claim.Record.State)
			return
		case idem.Completed:
			e.endPhase(ctx, PhaseClaim, Event{Claim: ClaimCompleted})
			e.recent.Keep(c.wk, claim.Record.Fingerprint, claim.Record.Response, claim.Record.ExpiresAt)
			c.replay(claim.Record.Response)
			return
		case idem.InFlight:
			// Claimed again, it is no longer a key nobody has seen.
			c.req.Unseen = false
			x.leaseEnds = claim.Record.LeaseExpiresAt
			if !watch.watching() {
				// Watch from now on and look again at once, so a completion
				// between the claim and the watch cannot be missed.
				watch.start(&e.local, c.wk)
				continue
			}
			if !c.waitChange(watch.changed, waits) {
				c.inFlightTooLong(x.leaseEnds)
				return
			}
			waits++
			watch.start(&e.local, c.wk)
			continue
		case idem.Acquired:
			watch.stop()
			e.endPhase(ctx, PhaseClaim, Event{Claim: ClaimAcquired, TookOver: claim.TookOver})
			x.acquired(claim)
			x.execute()
			return
		default:
			e.endPhase(ctx, PhaseClaim, Event{Claim: ClaimError})
			c.tally(OutcomeStoreError)
			c.log.LogAttrs(ctx, slog.LevelError, "idempotency store returned an unknown outcome", slog.Int("outcome", int(claim.Outcome)))
			c.face.Refuse(Refusal{Reason: RefusedStoreUnavailable, RetryAfter: time.Second})
			return
		}
	}
}

// keyWatch is a duplicate's watch for this process's completion of a key
// in flight (keywait.Local.Watch).
type keyWatch struct {
	changed <-chan struct{}
	end     func()
}

func (kw *keyWatch) watching() bool { return kw.changed != nil }

// start watches wk afresh, ending the watch before.
func (kw *keyWatch) start(local *keywait.Local, wk keywait.Key) {
	kw.stop()
	kw.changed, kw.end = local.Watch(wk)
}

// stop ends the watch, if any; the channel it watched stays, so that a
// stopped watch still counts as having watched.
func (kw *keyWatch) stop() {
	if kw.end != nil {
		kw.end()
		kw.end = nil
	}
}

// inFlightTooLong refuses a duplicate that waited as long as it may (or
// whose caller left). leaseEnds is when the holder's lease ends, as its
// last claim found it (zero: not known): the client may retry then, when
// a holder that died can be taken over; a live holder renews it meanwhile,
// and the retry waits again.
func (c *call) inFlightTooLong(leaseEnds time.Time) {
	left := callerLeft(c.ctx)
	c.e.endPhase(c.ctx, PhaseClaim, Event{Claim: ClaimInFlight, Err: left})
	c.tally(OutcomeConflict)
	retry := time.Second
	if !leaseEnds.IsZero() {
		retry = max(leaseEnds.Sub(c.e.cfg.Clock.Now()), time.Second)
	}
	if left == nil {
		c.log.LogAttrs(c.ctx, slog.LevelInfo, "duplicate still in flight after waiting", slog.Duration("retry_after", retry))
	}
	c.face.Refuse(Refusal{Reason: RefusedInFlight, RetryAfter: retry})
}

// refuseMismatch refuses a request whose key was used for another one,
// the key being in state.
func (c *call) refuseMismatch(state idem.State) {
	c.tally(OutcomeMismatch)
	c.e.endPhase(c.ctx, PhaseClaim, Event{Claim: ClaimMismatch})
	c.e.endPhase(c.ctx, PhaseReplay, Event{Status: 422})
	c.log.LogAttrs(c.ctx, slog.LevelInfo, "idempotency key reused with a different request", slog.String("state", state.String()))
	c.face.Refuse(Refusal{Reason: RefusedMismatch, State: state})
}

// waitGate waits until the execution held at the key's gate ends (true),
// or the deadline passes or the caller goes away (false).
func (c *call) waitGate(ended <-chan struct{}) bool {
	t := time.NewTimer(time.Until(c.deadline))
	defer t.Stop()
	select {
	case <-ended:
		return true
	case <-t.C:
	case <-c.ctx.Done():
	}
	return false
}

// waitChange blocks until the key may have changed, the poll interval
// passes, the deadline passes or the caller goes away. It returns false when
// the caller should stop waiting.
func (c *call) waitChange(changed <-chan struct{}, attempt int) bool {
	left := time.Until(c.deadline)
	if left <= 0 {
		return false
	}
	// Ask again soon at first (most requests finish quickly), then back off.
	step := 10 * time.Millisecond << min(attempt, 5)
	step = min(step, c.e.cfg.PollInterval, left)
	t := time.NewTimer(step)
	defer t.Stop()
	var storeSignal <-chan struct{}
	if w := c.e.waiter; w != nil {
		wctx, cancel := context.WithCancel(c.ctx)
		done := make(chan struct{})
		storeSignal = done
		go func() {
			defer close(done)
			w.WaitChange(wctx, c.wk.Scope, c.wk.Key)
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

// callerLeft returns why the caller left, nil while it waits: ctx's error,
// or context.DeadlineExceeded once ctx's deadline has passed, which may be
// a moment before ctx's own timer has ended it.
func callerLeft(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// reqLog logs about one request. The request's own attributes are added
// only to records that are actually logged, so with the level off a
// request costs nothing to log.
type reqLog struct {
	l            *slog.Logger
	scope        idem.Scope
	key          idem.Key
	method, path string
}

func (rl reqLog) LogAttrs(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if !rl.l.Enabled(ctx, level) {
		return
	}
	all := make([]slog.Attr, 0, len(attrs)+4)
	all = append(all, slog.Any("scope", rl.scope), slog.String("key", idem.KeyDigest(rl.scope, rl.key)))
	if rl.method != "" {
		all = append(all, slog.String("method", rl.method))
	}
	if rl.path != "" {
		all = append(all, slog.String("path", rl.path))
	}
	rl.l.LogAttrs(ctx, level, msg, append(all, attrs...)...)
}
