package idemhttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// A Problem used as an error reads as its title, and its detail after a
// colon when it has one.
func TestProblemAsAnError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p    idemhttp.Problem
		want string
	}{
		{idemhttp.Problem{Title: "Idempotency key missing"}, "Idempotency key missing"},
		{idemhttp.Problem{Title: "Idempotency key missing", Detail: "Send an Idempotency-Key header."}, "Idempotency key missing: Send an Idempotency-Key header."},
	} {
		var err error = &c.p
		if got := err.Error(); got != c.want {
			t.Errorf("Problem{Title: %q, Detail: %q}.Error() = %q; want %q", c.p.Title, c.p.Detail, got, c.want)
		}
		var p *idemhttp.Problem
		if !errors.As(err, &p) || p != &c.p {
			t.Errorf("errors.As does not find the Problem")
		}
	}
}

// Write sends Retry-After, in seconds, only for a problem that asks the
// client to wait (RetryAfter above 0): a 0 would tell it to retry at once.
func TestProblemWriteRetryAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		retryAfter int
		want       []string
	}{{0, nil}, {1, []string{"1"}}, {30, []string{"30"}}} {
		rec := httptest.NewRecorder()
		(&idemhttp.Problem{Title: "Idempotency store unavailable", Status: http.StatusServiceUnavailable, RetryAfter: c.retryAfter}).Write(rec)
		if got := rec.Header().Values("Retry-After"); len(got) != len(c.want) || len(got) > 0 && got[0] != c.want[0] {
			t.Errorf("Write with RetryAfter %d: Retry-After %q; want %q", c.retryAfter, got, c.want)
		}
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Content-Type") != idemhttp.ProblemContentType {
			t.Errorf("Write with RetryAfter %d: %d %q", c.retryAfter, rec.Code, rec.Header().Get("Content-Type"))
		}
	}
}
