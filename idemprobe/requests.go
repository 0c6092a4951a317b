package idemprobe

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// operation is one logical operation: its duplicates send the same body.
type operation struct {
	n    int64
	body string
}

func (p *prober) newOperation() operation {
	n := p.ops.Add(1)
	return operation{n: n, body: strings.ReplaceAll(p.cfg.Body, "{{n}}", strconv.FormatInt(n, 10))}
}

// variant is a different body for the same key: the next counter value
// where the template has one, else the body with one field or byte more.
// ok is false when there is no body to vary.
func (p *prober) variant(op operation) (operation, bool) {
	if strings.Contains(p.cfg.Body, "{{n}}") {
		return p.newOperation(), true
	}
	b := strings.TrimSpace(op.body)
	switch {
	case b == "":
		return operation{}, false
	case strings.HasPrefix(b, "{"):
		inner := strings.TrimSpace(b[1:])
		if strings.HasPrefix(inner, "}") {
			return operation{n: op.n, body: `{"idem_probe_variant":1}`}, true
		}
		return operation{n: op.n, body: `{"idem_probe_variant":1,` + inner}, true
	default:
		return operation{n: op.n, body: op.body + "\n"}, true
	}
}

// reserve takes n requests from the budget, all or none.
func (p *prober) reserve(n int) error {
	if p.sent.Add(int64(n)) > int64(p.cfg.MaxRequests) {
		p.sent.Add(-int64(n))
		return fmt.Errorf("%w: %d more requests would exceed the %d allowed", ErrBudget, n, p.cfg.MaxRequests)
	}
	return nil
}

// newRequest builds a request of op with key (none when noKey) and extra
// headers.
func (p *prober) newRequest(ctx context.Context, op operation, key string, noKey bool, extra ...[2]string) (*http.Request, error) {
	var body io.Reader
	if op.body != "" {
		body = strings.NewReader(op.body)
	}
	req, err := http.NewRequestWithContext(ctx, p.cfg.Method, p.target.String(), body)
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	for name, vs := range p.cfg.Header {
		for _, v := range vs {
			req.Header.Add(name, v)
		}
	}
	if req.Header.Get("Content-Type") == "" {
		if b := strings.TrimSpace(op.body); strings.HasPrefix(b, "{") || strings.HasPrefix(b, "[") {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if !noKey {
		req.Header.Set(p.cfg.KeyHeader, key)
	}
	for _, h := range extra {
		if h[0] != "" {
			req.Header.Set(h[0], h[1])
		}
	}
	return req, nil
}

// send makes one request of op with key and returns the exchange.
func (p *prober) send(ctx context.Context, op operation, key string, noKey bool, extra ...[2]string) Exchange {
	req, err := p.newRequest(ctx, op, key, noKey, extra...)
	if err != nil {
		return Exchange{Error: err.Error()}
	}
	ex := Exchange{Request: p.describeRequest(req, op.body)}
	if err := p.reserve(1); err != nil {
		ex.Error = err.Error()
		return ex
	}
	p.do(req, &ex, nil)
	// A failure met on the way, with the probe's plain request: not one it
	// caused with the fault header, nor one under another credential, which
	// a retry with the main one would not be a retry of.
	if len(extra) == 0 {
		p.noteFailure(key, op, ex)
	}
	return ex
}
