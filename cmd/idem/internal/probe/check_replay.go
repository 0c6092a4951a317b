package probe

import (
	"context"
	"fmt"
)

// checkSequentialReplay sends one operation twice with one fresh key: the
// second must get the first answer again. Its first request is the
// baseline; when that one does not succeed, it returns ErrBaseline.
func checkSequentialReplay(ctx context.Context, p *prober, c *Check) error {
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, c)
	first := p.send(ctx, op, key, false)
	c.record(first)
	if first.Error != "" {
		return fmt.Errorf("%w: %s %s: %s", ErrBaseline, p.cfg.Method, p.target.Redacted(), first.Error)
	}
	if !first.Response.success() {
		return fmt.Errorf("%w: %s %s with a fresh key answered %s: %s; the probe needs a request that succeeds",
			ErrBaseline, p.cfg.Method, p.target.Redacted(), first.Response.statusText(), first.Response.Body)
	}
	p.completed = completedOperation{key: key, op: op, answer: first.Response}
	second := p.send(ctx, op, key, false)
	c.record(second)
	if second.Error != "" {
		c.errorf("the duplicate got no answer: %s", second.Error)
		return nil
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	a, b := first.Response, second.Response
	// An answer naming the first's id is a replay, marked or not.
	if b.ID != "" && b.ID == a.ID {
		p.replays = append(p.replays, b)
	} else {
		p.noteReplay(b)
	}
	switch {
	case b.ID != "" && a.ID != "" && b.ID != a.ID:
		c.failf("the duplicate ran again: the first answer names %s, the duplicate %s", a.ID, b.ID)
	case counted && d != 1:
		c.failf("the effect grew by %d for one operation sent twice", d)
	case b.Status != a.Status:
		c.failf("the duplicate answered %s, the first %s", b.statusText(), a.statusText())
	case !sameBody(a.body, b.body):
		c.failf("the duplicate's body differs from the first's")
	case !counted && a.ID == "" && !b.replayed():
		c.passf("both answered %s with the same body (no id, Location or count tells whether it ran twice)", a.statusText())
	default:
		c.passf("the duplicate got the first answer again (%s%s)%s", a.statusText(), idNote(a), replayedNote(b))
	}
	return nil
}
