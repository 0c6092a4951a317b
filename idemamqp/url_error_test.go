package idemamqp_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/idemamqp"
)

// TestOpenErrorShowsNoSecret gives Open URLs that amqp091 refuses to parse,
// whose errors quote the URL: the password and a secret query parameter
// must not be in Open's error. No server is needed.
func TestOpenErrorShowsNoSecret(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"amqp://guest:SEKRET1@127.0.0.1:bad/",
		"amqps://guest@127.0.0.1:bad/?auth_token=SEKRET2",
	} {
		tr, err := idemamqp.Open(t.Context(), raw, nil)
		if err == nil {
			tr.Close()
			t.Errorf("Open(%q) succeeded; want a parse error", raw)
			continue
		}
		if strings.Contains(err.Error(), "SEKRET") || !strings.Contains(err.Error(), "idemamqp: dial") {
			t.Errorf("Open(%q) error %q; want it to say what failed, without the secret", raw, err)
		}
	}
}
