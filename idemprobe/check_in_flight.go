package idemprobe

import (
	"context"
	"net/http"
	"time"
)

// needsSlowHeader makes check 8 not applicable without Config.SlowHeader,
// the only way it has to hold a request in flight.
func needsSlowHeader(p *prober) string {
	if p.slow[0] == "" {
		return "no --slow-header given to hold a request in flight"
	}
	return ""
}

// checkInFlightDuplicate holds a request in flight with Config.SlowHeader
// and sends its duplicate meanwhile: the duplicate must wait for the
// first's answer or get 409 with Retry-After (only the latter with
// Config.Strict), and never run a second time.
func checkInFlightDuplicate(ctx context.Context, p *prober, c *Check) error {
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, c)
	slowReq, err := p.newRequest(ctx, op, key, false, p.slow)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	dupReq, err := p.newRequest(ctx, op, key, false)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	exs := []Exchange{{Request: p.describeRequest(slowReq, op.body)}, {Request: p.describeRequest(dupReq, op.body)}}
	if err := p.reserve(2); err != nil {
		c.errorf("%s", err)
		return nil
	}
	wrote := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.do(slowReq, &exs[0], wrote)
	}()
	// The duplicate leaves once the slow request is on the wire and has
	// had its head start to claim the key.
	<-wrote
	headStart := time.NewTimer(p.cfg.HeadStart)
	select {
	case <-headStart.C:
	case <-ctx.Done():
	}
	headStart.Stop()
	select {
	case <-done:
		c.record(exs[0])
		p.noteFailure(key, op, exs[0])
		c.errorf("the slow request was answered (%s) within the head start of %s: the slow header did not hold it in flight",
			answerOrError(exs[0]), p.cfg.HeadStart)
		return nil
	default:
	}
	p.do(dupReq, &exs[1], nil)
	<-done
	c.record(exs...)
	for _, ex := range exs {
		p.noteFailure(key, op, ex)
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	for _, ex := range exs {
		if ex.Error != "" {
			c.errorf("no answer: %s", ex.Error)
			return nil
		}
	}
	first, dup := exs[0].Response, exs[1].Response
	p.noteReplay(first)
	p.noteReplay(dup)
	switch {
	case first.ID != "" && dup.ID != "" && first.ID != dup.ID:
		c.failf("the duplicate ran while the first was in flight: the answers name %s and %s", first.ID, dup.ID)
	case counted && d != 1:
		c.failf("the slow request and its duplicate made the effect grow by %d", d)
	case dup.Status == http.StatusConflict && dup.Header["Retry-After"] == "":
		c.failf("the duplicate got 409 without Retry-After")
	case dup.Status == http.StatusConflict:
		c.passf("the duplicate got 409 with Retry-After: %s while the first ran", dup.Header["Retry-After"])
	case !first.success() || !dup.success():
		c.failf("the slow request answered %s and its duplicate %s", first.statusText(), dup.statusText())
	case dup.Status != first.Status || !sameBody(first.body, dup.body):
		c.failf("the duplicate's answer (%s) differs from the first's (%s)", dup.statusText(), first.statusText())
	case p.cfg.Strict:
		c.failf("the duplicate waited and got the first's answer (%s%s), not 409 while the first ran: strict, as the draft's §2.6 and §2.7 word it",
			dup.statusText(), idNote(dup))
	default:
		c.passf("the duplicate waited and got the first's answer (%s%s)", dup.statusText(), idNote(dup))
	}
	return nil
}
