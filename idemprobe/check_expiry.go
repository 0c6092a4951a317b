package idemprobe

import (
	"context"
	"fmt"
	"time"
)

// needsTTL makes check 11 not applicable without Config.TTL: the probe
// cannot know how long the endpoint keeps a key, and will not wait a day.
func needsTTL(p *prober) string {
	if p.cfg.TTL == 0 {
		return "no --ttl given to say how long the endpoint keeps a key"
	}
	return ""
}

// expiryGrace is how long past Config.TTL check 11 keeps asking before it
// calls the key unexpired: a server may check expiry coarsely (whole
// seconds, a purge that runs now and then). expiryPolls bounds the
// requests it sends meanwhile.
func expiryGrace(ttl time.Duration) time.Duration { return max(ttl/2, 200*time.Millisecond) }

const expiryPolls = 8

// checkKeyExpiry completes an operation, checks it is replayed at once,
// waits out Config.TTL from its answer and sends it again until it is no
// longer replayed, within a grace: the key must then run anew or be
// refused, per the server's policy, and the report says which. The draft
// leaves the choice to the server; what it may not do is replay forever
// what it says it forgets.
func checkKeyExpiry(ctx context.Context, p *prober, c *Check) error {
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, c)
	first := p.send(ctx, op, key, false)
	answered := time.Now()
	c.record(first)
	if !accepted(first) {
		c.errorf("the request was not accepted: %s", answerOrError(first))
		return nil
	}
	a := first.Response
	soon := p.send(ctx, op, key, false)
	soon.Note = "at once, within the TTL"
	c.record(soon)
	if soon.Error != "" {
		c.errorf("the duplicate within the TTL got no answer: %s", soon.Error)
		return nil
	}
	if !isReplayOf(soon.Response, a) {
		c.notApplicable(fmt.Sprintf("the key is not replayed even within its TTL (%s): see check 2", soon.Response.statusText()))
		return nil
	}
	p.noteReplay(soon.Response)
	deadline := answered.Add(p.cfg.TTL)
	grace := expiryGrace(p.cfg.TTL)
	every := grace / expiryPolls
	for poll := 0; ; poll++ {
		// The expiry is the condition waited for; the TTL is what the
		// endpoint says, so there is no event to wait on but the time.
		if err := sleepUntil(ctx, deadline); err != nil {
			c.errorf("the probe's timeout ran out while it waited for the key to expire")
			return nil
		}
		ex := p.send(ctx, op, key, false)
		ex.Note = fmt.Sprintf("%s after the first answer", time.Since(answered).Round(time.Millisecond))
		c.record(ex)
		if ex.Error != "" {
			c.errorf("the request after the TTL got no answer: %s", ex.Error)
			return nil
		}
		b := ex.Response
		switch {
		case b.Status >= 500:
			c.errorf("the request after the TTL answered %s", b.statusText())
			return nil
		case !b.success():
			d, counted, err := k.delta(ctx, c)
			switch {
			case err != nil:
				c.errorf("%s", err)
			case counted && d != 1:
				c.failf("after the TTL the key is refused (%s), but the effect grew by %d in all, want 1", b.statusText(), d)
			default:
				c.passf("after the TTL of %s the key is refused (%s): the server's policy is to refuse an expired key", p.cfg.TTL, b.statusText())
			}
			return nil
		case !isReplayOf(b, a):
			d, counted, err := k.delta(ctx, c)
			switch {
			case err != nil:
				c.errorf("%s", err)
			case counted && d != 2:
				c.failf("after the TTL the key answered anew (%s%s), but the effect grew by %d in all, want 2", b.statusText(), idNote(b), d)
			default:
				c.passf("after the TTL of %s the key ran anew (%s%s, first %s%s)", p.cfg.TTL, b.statusText(), idNote(b), a.statusText(), idNote(a))
			}
			return nil
		}
		p.noteReplay(b)
		if poll >= expiryPolls || time.Since(answered) > p.cfg.TTL+grace {
			c.failf("%s after the first answer, past the TTL of %s, the key is still replayed (%s%s)",
				time.Since(answered).Round(time.Millisecond), p.cfg.TTL, b.statusText(), idNote(b))
			return nil
		}
		deadline = time.Now().Add(every)
	}
}

// isReplayOf reports whether b is a's answer again: marked as a replay, or
// naming a's id, or else the same status and body.
func isReplayOf(b, a *Answer) bool {
	switch {
	case b.replayed():
		return true
	case a.ID != "" || b.ID != "":
		return a.ID == b.ID
	}
	return a.Status == b.Status && sameBody(a.body, b.body)
}

// sleepUntil waits until t, or returns ctx's error when it ends first.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
