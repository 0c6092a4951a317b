package idemprobe

import "context"

// checkReplayedCredentials reads every replay the other checks received:
// none may carry Set-Cookie, since a replay goes to whoever presents the
// key, not to the client that set the cookie.
func checkReplayedCredentials(_ context.Context, p *prober, c *Check) error {
	if len(p.replays) == 0 {
		c.notApplicable("no replay was seen to inspect")
		return nil
	}
	for _, a := range p.replays {
		if v := a.Header["Set-Cookie"]; v != "" {
			c.failf("a replay carries Set-Cookie (%s): another client's credentials go to whoever presents the key", v)
			c.record(Exchange{Response: a})
			return nil
		}
	}
	c.passf("none of %d replays carries Set-Cookie", len(p.replays))
	return nil
}
