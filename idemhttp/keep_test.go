package idemhttp_test

import (
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// DefaultKeep keeps the answers a retry would get again, 2xx, 3xx and 4xx,
// at each edge of those ranges, but the 4xx that ask the client to retry
// later (408, 425, 429); a 5xx, and anything below 200, is transient.
func TestDefaultKeep(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{100: false, 199: false, 200: true, 201: true, 299: true, 300: true, 304: true, 399: true,
		400: true, 404: true, 407: true, 408: false, 409: true, 422: true, 424: true, 425: false, 426: true, 428: true, 429: false, 430: true, 499: true,
		500: false, 502: false, 503: false, 599: false, 600: false} {
		if got := idemhttp.DefaultKeep(nil, status); got != want {
			t.Errorf("DefaultKeep(%d) = %t; want %t", status, got, want)
		}
	}
}
