package idempg_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// TestOpenErrorShowsNoSecret gives Open URLs that pgx refuses to parse:
// pgx masks password and sslpassword in its message, but quotes the rest of
// the URL, so every other secret must be masked by Open. No server is
// needed.
func TestOpenErrorShowsNoSecret(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"postgres://u@127.0.0.1:bad/db?token=SEKRET1&password=SEKRET2",
		"postgresql://u:SEKRET3@127.0.0.1:bad/db?api_key=SEKRET4",
	} {
		db, err := idempg.Open(t.Context(), raw, nil)
		if err == nil {
			db.Close()
			t.Errorf("Open(%q) succeeded; want a parse error", raw)
			continue
		}
		if strings.Contains(err.Error(), "SEKRET") {
			t.Errorf("Open(%q) error %q shows a secret", raw, err)
		}
		var ae *idem.ArgumentError
		if !errors.As(err, &ae) || ae.Field != "url" {
			t.Errorf("Open(%q) error %v, want an *idem.ArgumentError for the url", raw, err)
		}
	}
}
