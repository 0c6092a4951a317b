package idemprobe

import "context"

// checkLostResponse sends a request on a connection of its own, waits
// until the answer starts to arrive (so the work was done) and closes the
// connection without reading it, as a client whose network failed would;
// then it retries with the same key, which must get the first execution's
// answer.
func checkLostResponse(ctx context.Context, p *prober, c *Check) error {
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, c)
	req, err := p.newRequest(ctx, op, key, false)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	lost := Exchange{Request: p.describeRequest(req, op.body)}
	if err := p.reserve(1); err != nil {
		c.errorf("%s", err)
		return nil
	}
	if err := p.sendAndHangUp(ctx, req); err != nil {
		lost.Error = err.Error()
		c.record(lost)
		c.errorf("the request whose answer is lost: %s", err)
		return nil
	}
	lost.Note = "answer not read: the connection was closed on purpose as it began to arrive"
	c.record(lost)
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
	p.noteReplay(a)
	switch {
	case counted && d != 1:
		c.failf("the lost request and its retry made the effect grow by %d", d)
	case !a.success():
		c.failf("the retry answered %s", a.statusText())
	case counted:
		c.passf("the retry answered %s%s and the effect grew once%s", a.statusText(), idNote(a), replayedNote(a))
	case a.replayed():
		c.passf("the retry got the first execution's answer (%s%s%s)", a.statusText(), idNote(a), replayedNote(a))
	default:
		c.notApplicable("cannot tell from outside whether the retry ran again: it is not marked " + p.cfg.ReplayHeader + "; give --count")
	}
	return nil
}
