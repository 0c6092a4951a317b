package idemprobe

import (
	"context"
	"net/http"
)

// needsOtherHeader makes check 9 not applicable without Config.OtherHeader:
// the probe has no second credential of its own.
func needsOtherHeader(p *prober) string {
	if p.other[0] == "" {
		return "no --as-other given: a second credential is needed to send a key under another tenant"
	}
	return ""
}

// checkScopeIsolation sends a fresh operation under the main credential,
// then the same key and body under Config.OtherHeader: the other
// credential must not get the first one's answer, which would give one
// tenant another's data (and let it learn which keys another uses). It
// may run the operation as its own or refuse it; either keeps the scopes
// apart.
func checkScopeIsolation(ctx context.Context, p *prober, c *Check) error {
	key, op := p.cfg.NewKey(), p.newOperation()
	mine := p.send(ctx, op, key, false)
	c.record(mine)
	if !accepted(mine) {
		c.errorf("the first credential's request was not accepted: %s", answerOrError(mine))
		return nil
	}
	theirs := p.send(ctx, op, key, false, p.other)
	theirs.Note = "the same key and body under the other credential"
	c.record(theirs)
	if theirs.Error != "" {
		c.errorf("the other credential's request got no answer: %s", theirs.Error)
		return nil
	}
	a, b := mine.Response, theirs.Response
	p.noteReplay(b)
	switch {
	case b.ID != "" && b.ID == a.ID:
		c.failf("the other credential got the first one's answer (%s, %s): keys are not scoped by credential", b.statusText(), b.ID)
	case b.replayed():
		c.failf("the other credential got an answer marked %s (%s) for a key only the first one used", b.replayHeader, b.statusText())
	case b.Status == a.Status && sameBody(a.body, b.body) && a.ID == "":
		c.failf("the other credential got the same status and body as the first (%s): keys are not scoped by credential", b.statusText())
	case b.Status == http.StatusUnauthorized:
		c.errorf("the other credential was refused with %s: --as-other needs a credential the endpoint accepts", b.statusText())
	case b.success():
		c.passf("the other credential's request ran as its own (%s%s), not the first's %s", b.statusText(), idNote(b), a.ID)
	default:
		c.passf("the other credential was refused (%s), not given the first one's answer", b.statusText())
	}
	return nil
}
