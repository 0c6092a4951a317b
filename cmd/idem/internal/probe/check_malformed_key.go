package probe

import (
	"context"
	"fmt"
	"net/http"
	"strings"
)

// malformedKeyLen is longer than the 255 characters Stripe and idem
// accept.
const malformedKeyLen = 300

// checkMalformedKey sends a key too long and a key with a control
// character in it: each must be refused with 400, and run nothing.
func checkMalformedKey(ctx context.Context, p *prober, c *Check) error {
	k := p.startCount(ctx, c)
	keys := []struct{ what, key string }{
		{fmt.Sprintf("%d characters", malformedKeyLen), strings.Repeat("k", malformedKeyLen)},
		{"a control character (tab)", "probe\t" + p.cfg.NewKey()},
	}
	var wrong []string
	for _, mk := range keys {
		ex := p.send(ctx, p.newOperation(), mk.key, false)
		c.record(ex)
		if ex.Error != "" {
			c.errorf("no answer: %s", ex.Error)
			return nil
		}
		if ex.Response.Status != http.StatusBadRequest {
			wrong = append(wrong, fmt.Sprintf("a key of %s got %s", mk.what, ex.Response.statusText()))
		}
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	switch {
	case len(wrong) > 0:
		c.failf("%s, want 400", strings.Join(wrong, "; "))
	case counted && d != 0:
		c.failf("answered 400 but the effect grew by %d", d)
	default:
		c.passf("a key of %d characters and one with a tab both got 400", malformedKeyLen)
	}
	return nil
}
