package probe

import "context"

// needsFaultHeader makes check 7 not applicable without Config.FaultHeader,
// the only way it has to make the endpoint fail.
func needsFaultHeader(p *prober) string {
	if p.fault[0] == "" {
		return "no --fault-header given to make the endpoint fail"
	}
	return ""
}

// checkTransientFailure makes the endpoint fail with Config.FaultHeader,
// then retries with the same key without it: the 5xx must not have been
// kept, so the retry runs again and succeeds.
func checkTransientFailure(ctx context.Context, p *prober, c *Check) error {
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
	case a.Status >= 500 && (a.replayed() || sameBody(a.body, failed.Response.body)):
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
