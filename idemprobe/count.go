package idemprobe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// count reads the effect's count, and the exchange that did.
func (p *prober) count(ctx context.Context) (int64, Exchange, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.CountURL, nil)
	if err != nil {
		return 0, Exchange{}, fmt.Errorf("building the count request: %w", err)
	}
	for name, vs := range p.cfg.Header {
		if http.CanonicalHeaderKey(name) == "Content-Type" {
			continue
		}
		for _, v := range vs {
			req.Header.Add(name, v)
		}
	}
	ex := Exchange{Request: p.describeRequest(req, "")}
	if err := p.reserve(1); err != nil {
		return 0, ex, err
	}
	p.do(req, &ex, nil)
	if ex.Error != "" {
		return 0, ex, fmt.Errorf("reading the count: %s", ex.Error)
	}
	if ex.Response.Status != http.StatusOK {
		return 0, ex, fmt.Errorf("reading the count: status %d, want 200", ex.Response.Status)
	}
	n, err := parseCount(ex.Response.body)
	if err != nil {
		return 0, ex, fmt.Errorf("reading the count: %w", err)
	}
	ex.Note = fmt.Sprintf("count: %d", n)
	return n, ex, nil
}

// parseCount reads a JSON list, an object with a "data" list, or a number.
func parseCount(b []byte) (int64, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return 0, fmt.Errorf("the answer is not JSON: %w", err)
	}
	switch v := v.(type) {
	case []any:
		return int64(len(v)), nil
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return 0, fmt.Errorf("the count %s is not an integer", v)
		}
		return n, nil
	case map[string]any:
		if l, ok := v["data"].([]any); ok {
			return int64(len(l)), nil
		}
	}
	return 0, errors.New(`the answer is neither a list, an object with a "data" list, nor a number`)
}

// counter counts the effect around one check; with no CountURL it does
// nothing.
type counter struct {
	p      *prober
	before int64
	err    error
}

// startCount reads the count before a check. A failed read is kept for
// delta to report, so that the check's own requests still run and show.
func (p *prober) startCount(ctx context.Context, c *Check) *counter {
	k := &counter{p: p}
	if p.cfg.CountURL == "" {
		return k
	}
	n, ex, err := p.count(ctx)
	c.record(ex)
	k.before, k.err = n, err
	return k
}

// delta returns how much the effect grew; ok is false without a CountURL.
func (k *counter) delta(ctx context.Context, c *Check) (d int64, ok bool, err error) {
	if k.p.cfg.CountURL == "" {
		return 0, false, nil
	}
	if k.err != nil {
		return 0, false, k.err
	}
	n, ex, err := k.p.count(ctx)
	c.record(ex)
	if err != nil {
		return 0, false, err
	}
	return n - k.before, true, nil
}
