package keyed

import (
	"log/slog"

	"github.com/idem-go/idem"
)

// answerFromRecord answers a duplicate of a key seen completed lately from
// the key's record, read without claiming it, and reports whether it did:
// a record that is completed is replayed, one with another fingerprint
// refused. Anything else (the key gone, in flight again after it expired,
// the store failing) is left to the claim.
func (c *call) answerFromRecord() bool {
	e, ctx := c.e, c.ctx
	// Ended here with no status when the claim is left to answer.
	defer e.endPhase(ctx, PhaseReplay, Event{})
	e.beginPhase(ctx, PhaseReplay)
	e.markStore(ctx)
	if e.replayer != nil {
		resp, mismatch, err := e.replayer.Replay(ctx, c.req.Scope, c.req.Key, c.req.Fingerprint)
		e.storeSince(ctx, StoreReplay, err)
		switch {
		case err != nil:
			return false
		case mismatch:
			c.refuseMismatch(idem.StateCompleted)
			return true
		case resp == nil:
			return false
		}
		c.replay(resp)
		return true
	}
	rec, err := e.store.Get(ctx, c.req.Scope, c.req.Key)
	e.storeSince(ctx, StoreGet, err)
	switch {
	case err != nil:
		return false
	case rec.Fingerprint != c.req.Fingerprint:
		c.refuseMismatch(rec.State)
		return true
	case rec.State != idem.StateCompleted || rec.Response == nil:
		return false
	}
	e.recent.Keep(c.wk, rec.Fingerprint, rec.Response, rec.ExpiresAt)
	c.replay(rec.Response)
	return true
}

// replay answers a duplicate with the key's kept answer, its body opened.
func (c *call) replay(resp *idem.Response) {
	e, ctx := c.e, c.ctx
	e.beginPhase(ctx, PhaseReplay)
	if resp == nil {
		// A store that completed a key with no answer: an empty one.
		resp = &idem.Response{Status: 200}
	}
	var err error
	if len(resp.Body) > 0 {
		var body []byte
		var sealed bool
		if body, sealed, err = e.bodies.open(c.log.scope, c.log.key, resp.Body); err == nil && sealed {
			opened := *resp
			opened.Body = body
			resp = &opened
		}
	}
	if err == nil {
		err = c.face.Replay(resp)
	}
	if err != nil {
		// The effect happened and its answer is kept: running again
		// would repeat it, so the duplicate is refused instead, until an
		// operator restores what reads it.
		c.tally(OutcomeStoreError)
		e.endPhase(ctx, PhaseReplay, Event{Status: 500, Err: err})
		c.log.LogAttrs(ctx, slog.LevelError, "kept answer unreadable: duplicate refused", slog.String("error", err.Error()))
		c.face.Refuse(Refusal{Reason: RefusedUnreadable, Err: err})
		return
	}
	c.tally(OutcomeReplayed)
	e.endPhase(ctx, PhaseReplay, Event{Status: resp.Status})
	c.log.LogAttrs(ctx, slog.LevelDebug, "idempotent replay", slog.Int("status", resp.Status))
}
