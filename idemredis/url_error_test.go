package idemredis_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/idemredis"
)

// TestOpenErrorShowsNoSecret gives Open URLs that rueidis refuses: the
// password and secret query parameters must not be in Open's error. No
// server is needed.
func TestOpenErrorShowsNoSecret(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://:SEKRET1@127.0.0.1:bad/0",
		"rediss://u:SEKRET2@127.0.0.1:bad/0?password=SEKRET3",
		"redis://u:SEKRET4%zz@127.0.0.1/0",
		"redis://127.0.0.1/db0?password=SEKRET5",
	} {
		s, err := idemredis.Open(t.Context(), raw, nil)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded; want an error", raw)
			continue
		}
		if strings.Contains(err.Error(), "SEKRET") || !strings.Contains(err.Error(), "idemredis: invalid Redis URL") {
			t.Errorf("Open(%q) error %q; want it to say what failed, without the secret", raw, err)
		}
	}
}
