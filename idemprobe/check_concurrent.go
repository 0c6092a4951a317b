package idemprobe

import (
	"context"
	"fmt"
	"net/http"
	"sync"
)

// checkConcurrentDuplicates sends Config.Concurrency requests of one
// operation with one fresh key at once: they must run once, every
// successful answer the same and any other 409.
func checkConcurrentDuplicates(ctx context.Context, p *prober, c *Check) error {
	n := p.cfg.Concurrency
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, c)
	reqs := make([]*http.Request, n)
	exs := make([]Exchange, n)
	for i := range reqs {
		req, err := p.newRequest(ctx, op, key, false)
		if err != nil {
			c.errorf("%s", err)
			return nil
		}
		reqs[i], exs[i].Request = req, p.describeRequest(req, op.body)
	}
	if err := p.reserve(n); err != nil {
		c.errorf("%s", err)
		return nil
	}
	// Every request waits at the gate so they leave together.
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			<-gate
			p.do(reqs[i], &exs[i], nil)
		})
	}
	close(gate)
	wg.Wait()
	c.record(exs...)
	for _, ex := range exs {
		p.noteFailure(key, op, ex)
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	var ok []*Answer
	ids := map[string]bool{}
	conflicts := 0
	for _, ex := range exs {
		switch {
		case ex.Error != "":
			c.errorf("a request got no answer: %s", ex.Error)
			return nil
		case ex.Response.success():
			ok = append(ok, ex.Response)
			if ex.Response.ID != "" {
				ids[ex.Response.ID] = true
			}
		case ex.Response.Status == http.StatusConflict:
			conflicts++
		default:
			c.failf("a duplicate answered %s, neither the first answer nor 409", ex.Response.statusText())
			return nil
		}
	}
	for _, a := range ok {
		p.noteReplay(a)
	}
	conflictNote := ""
	if conflicts > 0 {
		conflictNote = fmt.Sprintf("; %d got 409 while the first ran", conflicts)
	}
	switch {
	case len(ids) > 1:
		c.failf("%d requests with one key ran %d times: the answers name %d different ids", n, len(ids), len(ids))
	case counted && d != 1:
		c.failf("%d requests with one key made the effect grow by %d", n, d)
	case len(ok) == 0:
		c.failf("none of %d requests succeeded (%d got 409)", n, conflicts)
	case !allSame(ok):
		c.failf("the %d successful answers differ in status or body", len(ok))
	default:
		c.passf("%d at once ran once: %d answered %s%s%s", n, len(ok), ok[0].statusText(), idNote(ok[0]), conflictNote)
	}
	return nil
}
