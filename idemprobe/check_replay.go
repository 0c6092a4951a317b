package idemprobe

import (
	"context"
	"strings"
)

// checkSequentialReplay sends one operation twice with one fresh key: the
// second must get the first answer again. Its first request is the
// baseline, which every other check needs the endpoint to accept; when it
// is not accepted, baseline diagnoses why instead.
func checkSequentialReplay(ctx context.Context, p *prober, c *Check) error {
	k := p.startCount(ctx, c)
	key, op, first, ok := p.baseline(ctx, c)
	if !ok {
		return nil
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

// baseline sends a fresh operation with a fresh key until the endpoint
// accepts it, as a client would: the same key once more, then a fresh one.
// Every attempt is evidence, and a 5xx met on the way is kept with its
// retry (and the fresh key's answer) for check 7 to judge. When no attempt succeeds, it marks the
// check as not run (the endpoint fails every request) and ok is false.
func (p *prober) baseline(ctx context.Context, c *Check) (key string, op operation, first Exchange, ok bool) {
	key, op = p.cfg.NewKey(), p.newOperation()
	first = p.send(ctx, op, key, false)
	c.record(first)
	if accepted(first) {
		return key, op, first, true
	}
	attempts := []Exchange{first}
	retry := p.send(ctx, op, key, false)
	retry.Note = "the baseline's retry with the same key"
	c.record(retry)
	attempts = append(attempts, retry)
	met := p.failureOf(key) // send kept a 5xx, which this retry judges
	if met != nil {
		met.retry = &retry
	}
	if accepted(retry) {
		return key, op, retry, true
	}
	// The same key may be stuck on what it kept: a fresh one tells a
	// key's trouble from the endpoint's.
	key, op = p.cfg.NewKey(), p.newOperation()
	fresh := p.send(ctx, op, key, false)
	fresh.Note = "the baseline with a fresh key"
	c.record(fresh)
	attempts = append(attempts, fresh)
	if met != nil {
		met.fresh = &fresh
	}
	if accepted(fresh) {
		return key, op, fresh, true
	}
	p.baselineFailed = true
	seen := make([]string, len(attempts))
	for i, ex := range attempts {
		seen[i] = answerOrError(ex)
	}
	c.errorf("could not run: %s %s answered %s (the first attempt, its retry with the same key, a fresh key); "+
		"the probe needs a request that succeeds: check --header, --body and --method",
		p.cfg.Method, p.target.Redacted(), strings.Join(seen, ", "))
	return "", operation{}, Exchange{}, false
}

// accepted reports whether ex got a successful answer.
func accepted(ex Exchange) bool { return ex.Error == "" && ex.Response != nil && ex.Response.success() }
