package probe

import (
	"context"
	"fmt"
	"net/http"
)

// checkMissingKey sends an operation without a key: it must be refused
// with 400, unless the endpoint runs it, and so does not require keys.
func checkMissingKey(ctx context.Context, p *prober, c *Check) error {
	k := p.startCount(ctx, c)
	ex := p.send(ctx, p.newOperation(), "", true)
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
	switch a := ex.Response; {
	case a.success():
		c.notApplicable(fmt.Sprintf("the endpoint does not require keys: it answered %s without one", a.statusText()))
	case a.Status != http.StatusBadRequest:
		c.failf("answered %s without a key, want 400", a.statusText())
	case counted && d != 0:
		c.failf("answered 400 but the effect grew by %d", d)
	default:
		c.passf("answered 400 without a key")
	}
	return nil
}
