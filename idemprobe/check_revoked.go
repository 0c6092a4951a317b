package idemprobe

import (
	"context"
	"net/http"
)

// needsRevoke makes check 10 not applicable without a credential to revoke
// and the request that revokes it: the probe cannot revoke one by itself.
func needsRevoke(p *prober) string {
	if p.revoke == nil {
		return "no --revocable and --revoke given: the probe cannot revoke a credential by itself"
	}
	return ""
}

// checkRevokedCredential uses a key under Config.RevocableHeader, revokes
// that credential with Config.Revoke, and sends the key again under it:
// the answer must be a refusal (401 or 403), not the replay. A server that
// looks replays up before it authenticates would hand a revoked
// credential's past answers (and their data) to whoever still holds it.
func checkRevokedCredential(ctx context.Context, p *prober, c *Check) error {
	key, op := p.cfg.NewKey(), p.newOperation()
	first := p.send(ctx, op, key, false, p.revocable)
	first.Note = "under the revocable credential"
	c.record(first)
	if !accepted(first) {
		c.errorf("the revocable credential's request was not accepted: %s", answerOrError(first))
		return nil
	}
	revoked, err := p.sendRevoke(ctx)
	c.record(revoked)
	if err != "" {
		c.errorf("revoking the credential: %s", err)
		return nil
	}
	again := p.send(ctx, op, key, false, p.revocable)
	again.Note = "the same key under the revoked credential"
	c.record(again)
	if again.Error != "" {
		c.errorf("the request under the revoked credential got no answer: %s", again.Error)
		return nil
	}
	a := again.Response
	p.noteReplay(a)
	if refusedCredential(a) {
		c.passf("after the revocation the key's replay was refused (%s)", a.statusText())
		return nil
	}
	// Whether the credential was revoked at all: a fresh key under it.
	probe := p.send(ctx, p.newOperation(), p.cfg.NewKey(), false, p.revocable)
	probe.Note = "a fresh key under the revoked credential, to tell whether it was revoked"
	c.record(probe)
	switch {
	case probe.Error != "":
		c.errorf("the fresh key under the revoked credential got no answer: %s", probe.Error)
	case !refusedCredential(probe.Response):
		c.errorf("the credential still works after the revoke request (a fresh key answered %s): its revocation did not take",
			probe.Response.statusText())
	case a.success():
		c.failf("the revoked credential still got the key's answer (%s%s%s) while a fresh key under it is refused (%s)",
			a.statusText(), idNote(a), replayedNote(a), probe.Response.statusText())
	default:
		c.failf("the revoked credential got %s for the key, while a fresh key under it is refused (%s)",
			a.statusText(), probe.Response.statusText())
	}
	return nil
}

// refusedCredential reports whether a refuses the credential it was sent
// with.
func refusedCredential(a *Answer) bool {
	return a.Status == http.StatusUnauthorized || a.Status == http.StatusForbidden
}

// sendRevoke sends Config.Revoke with the revocable credential; err says
// why it failed, "" when it answered 2xx.
func (p *prober) sendRevoke(ctx context.Context) (Exchange, string) {
	req, err := http.NewRequestWithContext(ctx, p.revokeBy, p.revoke.String(), nil)
	if err != nil {
		return Exchange{Error: err.Error()}, err.Error()
	}
	for name, vs := range p.cfg.Header {
		if http.CanonicalHeaderKey(name) != "Content-Type" {
			req.Header[http.CanonicalHeaderKey(name)] = vs
		}
	}
	req.Header.Set(p.revocable[0], p.revocable[1])
	ex := Exchange{Request: p.describeRequest(req, ""), Note: "the revoke request"}
	if err := p.reserve(1); err != nil {
		ex.Error = err.Error()
		return ex, ex.Error
	}
	p.do(req, &ex, nil)
	switch {
	case ex.Error != "":
		return ex, ex.Error
	case !ex.Response.success():
		return ex, "it answered " + ex.Response.statusText() + ", want 2xx"
	}
	return ex, ""
}
