package idemnats_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/idemnats"
)

// TestOpenErrorShowsNoSecret gives Open URLs that nats.go refuses to parse,
// whose errors quote the URL: the token, the password and a secret query
// parameter must not be in Open's error. No server is needed.
func TestOpenErrorShowsNoSecret(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"nats://SEKRET1@127.0.0.1:bad",
		"nats://u:SEKRET2@127.0.0.1:bad",
		"nats://127.0.0.1:bad?token=SEKRET3",
		"nats://127.0.0.1:4222,nats://SEKRET4@127.0.0.1:bad",
	} {
		tr, err := idemnats.Open(t.Context(), raw, nil)
		if err == nil {
			tr.Close()
			t.Errorf("Open(%q) succeeded; want a parse error", raw)
			continue
		}
		if strings.Contains(err.Error(), "SEKRET") || !strings.Contains(err.Error(), "idemnats: connect") {
			t.Errorf("Open(%q) error %q; want it to say what failed, without the secret", raw, err)
		}
	}
}
