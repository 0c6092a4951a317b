package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// NewCompleter's refusals name what idemhttp's caller gave, never the
// engine's own types: a store that keeps no recovery points is the
// Middleware's, a bad setting an idemhttp.CompleterConfig field.
func TestNewCompleterRefusalsNameIdemhttpsFields(t *testing.T) {
	t.Parallel()
	resume := func(context.Context, http.ResponseWriter, idemhttp.Execution) error { return nil }
	m, err := idemhttp.New(&idemhttp.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := idemhttp.New(&idemhttp.Config{Store: struct{ idem.Store }{idemmem.NewStore(nil)}, SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		m     *idemhttp.Middleware
		cfg   *idemhttp.CompleterConfig
		field string
	}{
		{"no Resume", m, &idemhttp.CompleterConfig{}, "idemhttp.CompleterConfig.Resume"},
		{"a negative Every", m, &idemhttp.CompleterConfig{Resume: resume, Every: -1}, "idemhttp.CompleterConfig.Every"},
		{"a negative Limit", m, &idemhttp.CompleterConfig{Resume: resume, Limit: -1}, "idemhttp.CompleterConfig.Limit"},
		{"a store with no recovery points", plain, &idemhttp.CompleterConfig{Resume: resume}, "idemhttp.Middleware"},
	} {
		comp, err := c.m.NewCompleter(c.cfg)
		var ae *idem.ArgumentError
		if comp != nil || !errors.As(err, &ae) || ae.Field != c.field || !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("NewCompleter with %s: %v, %v; want an ArgumentError naming %s", c.name, comp, err, c.field)
		}
	}
}

// The middleware reads no more of a request body than a byte past
// MaxBodyBytes, whatever its length and however it is announced: enough to
// refuse it as too large, and no more of a large upload.
func TestBodyReadStopsAByteAfterTheLimit(t *testing.T) {
	t.Parallel()
	const limit = 1000
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), MaxBodyBytes: limit})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran for a body too large") }))
	for _, size := range []int{limit + 1, 10 * limit, 1 << 20} {
		body := &countingReader{left: size}
		req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", body)
		req.ContentLength = -1 // unknown: read until the limit tells
		req.Header.Set(idemhttp.HeaderKey, "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusRequestEntityTooLarge || body.read > limit+1 {
			t.Errorf("a body of %d bytes, unannounced: %d after reading %d bytes; want 413 after at most %d", size, rec.Code, body.read, limit+1)
		}
	}
}

// countingReader is a body of left bytes that counts those read.
type countingReader struct{ left, read int }

func (c *countingReader) Read(p []byte) (int, error) {
	if c.left == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.left)
	for i := range n {
		p[i] = 'x'
	}
	c.left -= n
	c.read += n
	return n, nil
}
