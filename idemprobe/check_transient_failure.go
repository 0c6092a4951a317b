package idemprobe

import (
	"context"
	"fmt"
)

// maxFailuresJudged bounds the 5xx met on the way that check 7 retries, so
// that a flaky endpoint does not spend the budget.
const maxFailuresJudged = 3

// checkTransientFailure judges whether a 5xx was kept. It runs after the
// other checks and first judges the 5xx they met on the way, whatever the
// flags: it retries each with its key (the baseline already did), and
// when the retry gets the same 5xx unmarked, sends a fresh key too, to
// tell a key stuck on a kept failure from an endpoint that still fails.
// Then, with Config.FaultHeader, it makes the endpoint fail and retries
// with the same key without the header: the 5xx must not have been kept,
// so the retry runs again and succeeds.
func checkTransientFailure(ctx context.Context, p *prober, c *Check) error {
	var judged []*metFailure
	for _, f := range p.failures {
		if len(judged) == maxFailuresJudged {
			break
		}
		if f.retry == nil {
			if p.baselineFailed {
				continue // nothing is accepted: more requests tell nothing
			}
			retry := p.send(ctx, f.op, f.key, false)
			retry.Note = "a retry of a 5xx met on the way, with its key"
			f.retry = &retry
			if sameFailure(f.failed, retry) {
				fresh := p.send(ctx, p.newOperation(), p.cfg.NewKey(), false)
				fresh.Note = "a fresh key, to tell whether the endpoint still fails"
				f.fresh = &fresh
			}
		}
		judged = append(judged, f)
		c.record(f.failed, *f.retry)
		if f.fresh != nil {
			c.record(*f.fresh)
		}
		if kept(f.failed, *f.retry, f.fresh) {
			c.failf("met on the way: the retry with the same key got the %s replayed: a transient failure was kept",
				f.failed.Response.statusText())
			return nil
		}
	}
	if p.fault[0] == "" || p.baselineFailed {
		if len(judged) == 0 {
			if p.baselineFailed {
				c.notRun("the endpoint accepted none of the probe's requests, and none of its failures was a 5xx")
			} else {
				c.notApplicable("no --fault-header given to make the endpoint fail, and no 5xx was met on the way")
			}
			return nil
		}
		f := judged[0]
		switch {
		case accepted(*f.retry):
			c.passf("met on the way: after %s the retry with the same key ran again and answered %s%s",
				f.failed.Response.statusText(), f.retry.Response.statusText(), idNote(f.retry.Response))
		case sameFailure(f.failed, *f.retry):
			// Not kept only because a fresh key got the same answer: an
			// endpoint that fails everything alike tells nothing.
			c.notRun(fmt.Sprintf("every key got the same %s, unmarked: whether it was kept cannot be told", f.failed.Response.statusText()))
		default:
			c.passf("met on the way: after %s the retry with the same key was not given it again (%s)",
				f.failed.Response.statusText(), answerOrError(*f.retry))
		}
		return nil
	}
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, c)
	failed := p.send(ctx, op, key, false, p.fault)
	c.record(failed)
	if failed.Error != "" {
		c.errorf("the failing request got no answer: %s", failed.Error)
		return nil
	}
	if failed.Response.Status < 500 {
		c.errorf("the fault header did not make the endpoint fail: it answered %s, want a 5xx", failed.Response.statusText())
		return nil
	}
	retry := p.send(ctx, op, key, false)
	c.record(retry)
	if retry.Error != "" {
		c.errorf("the retry got no answer: %s", retry.Error)
		return nil
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	a := retry.Response
	switch {
	case kept(failed, retry, nil):
		c.failf("the retry got the %s replayed: a transient failure was kept", failed.Response.statusText())
	case !a.success():
		c.failf("the retry answered %s, want it to run again and succeed", a.statusText())
	case a.replayed():
		c.failf("the retry answered %s marked %s after a %s", a.statusText(), a.replayHeader, failed.Response.statusText())
	case counted && d != 1:
		c.failf("the failure and its retry made the effect grow by %d, want 1", d)
	default:
		c.passf("after %s the retry ran again and answered %s%s", failed.Response.statusText(), a.statusText(), idNote(a))
	}
	return nil
}

// kept reports whether retry, sent with failed's key, got failed's 5xx
// again: marked as a replay, or the same status and body. fresh, when not
// nil, is what a fresh key got meanwhile: when it is that same 5xx too,
// an endpoint that fails every request in the same words cannot be told
// from one that keeps its failures, and only the mark counts.
func kept(failed, retry Exchange, fresh *Exchange) bool {
	if failed.Response == nil || retry.Response == nil || failed.Response.Status < 500 {
		return false
	}
	a := retry.Response
	if a.Status < 500 {
		return false
	}
	if a.replayed() {
		return true
	}
	if fresh != nil && sameFailure(failed, *fresh) {
		return false
	}
	return sameFailure(failed, retry)
}

// sameFailure reports whether ex got failed's status and body.
func sameFailure(failed, ex Exchange) bool {
	f, b := failed.Response, ex.Response
	return f != nil && b != nil && b.Status == f.Status && sameBody(b.body, f.body)
}
