package probe

import (
	"context"
	"fmt"
)

// checkTransientFailure judges whether a 5xx was kept. It first judges the
// 5xx the baseline met on the way, if any, by the retry the baseline sent
// with its key: a server that fails and keeps the failure shows it there,
// with or without a fault header. Then, with Config.FaultHeader, it makes
// the endpoint fail and retries with the same key without the header: the
// 5xx must not have been kept, so the retry runs again and succeeds.
func checkTransientFailure(ctx context.Context, p *prober, c *Check) error {
	for _, f := range p.failures {
		c.record(f.failed, f.retry)
		if f.fresh != nil {
			c.record(*f.fresh)
		}
		if kept(f.failed, f.retry, f.fresh) {
			c.failf("met on the way: the retry with the same key got the %s replayed: a transient failure was kept",
				f.failed.Response.statusText())
			return nil
		}
	}
	if p.fault[0] == "" || p.baselineFailed {
		if len(p.failures) == 0 {
			if p.baselineFailed {
				c.notRun("the endpoint accepted none of the probe's requests, and none of its failures was a 5xx")
			} else {
				c.notApplicable("no --fault-header given to make the endpoint fail, and no 5xx was met on the way")
			}
			return nil
		}
		f := p.failures[0]
		switch {
		case accepted(f.retry):
			c.passf("met on the way: after %s the retry with the same key ran again and answered %s%s",
				f.failed.Response.statusText(), f.retry.Response.statusText(), idNote(f.retry.Response))
		case f.retry.Response != nil && f.retry.Response.Status == f.failed.Response.Status && sameBody(f.retry.Response.body, f.failed.Response.body):
			// Not kept only because a fresh key got the same answer: an
			// endpoint that fails everything alike tells nothing.
			c.notRun(fmt.Sprintf("every key got the same %s, unmarked: whether it was kept cannot be told", f.failed.Response.statusText()))
		default:
			c.passf("met on the way: after %s the retry with the same key was not given it again (%s)",
				f.failed.Response.statusText(), answerOrError(f.retry))
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
		c.failf("the retry answered %s marked Idempotent-Replayed after a %s", a.statusText(), failed.Response.statusText())
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
	f, a := failed.Response, retry.Response
	if a.Status < 500 {
		return false
	}
	if a.replayed() {
		return true
	}
	same := func(b *Answer) bool { return b != nil && b.Status == f.Status && sameBody(b.body, f.body) }
	if fresh != nil && same(fresh.Response) {
		return false
	}
	return same(a)
}
