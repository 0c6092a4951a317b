package idemprobe

import (
	"context"
	"net/http"
)

// checkKeyReuse sends the key of check 2's completed operation with
// another body: it must be refused with 422, and run nothing.
func checkKeyReuse(ctx context.Context, p *prober, c *Check) error {
	done := p.completed
	other, ok := p.variant(done.op)
	if !ok {
		c.notApplicable("the request has no body to vary")
		return nil
	}
	k := p.startCount(ctx, c)
	ex := p.send(ctx, other, done.key, false)
	c.record(ex)
	if ex.Error != "" {
		c.errorf("no answer: %s", ex.Error)
		return nil
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	a := ex.Response
	switch {
	case counted && d != 0:
		c.failf("the key of a completed request, sent with another body, ran again (the effect grew by %d)", d)
	case a.Status == http.StatusUnprocessableEntity:
		c.passf("answered 422 to the key of a completed request with another body")
	case a.success() && done.answer != nil && a.ID != "" && a.ID == done.answer.ID:
		c.failf("answered %s with the first request's answer: the body was not compared", a.statusText())
	case a.success():
		c.failf("answered %s: the other body ran under the same key", a.statusText())
	default:
		c.failf("answered %s, want 422", a.statusText())
	}
	return nil
}
