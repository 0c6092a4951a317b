package idemtest

import (
	"strings"
	"testing"
)

// TestServiceAddressShowsNoSecret checks every secret a service URL can
// carry, not only the user-info password: the gate's skip and failure
// messages show the URL.
func TestServiceAddressShowsNoSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, shown, secret string }{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=SEKRET1", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=xxxxx", "SEKRET1"},
		{"postgres://u:SEKRET2@db.internal/test", "postgres://u:xxxxx@db.internal/test", "SEKRET2"},
		{"nats://SEKRET3@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222", "SEKRET3"},
		{"nats://127.0.0.1:4222?token=SEKRET4", "nats://127.0.0.1:4222?token=xxxxx", "SEKRET4"},
		{"amqp://guest:guest@127.0.0.1:5672/?auth_token=SEKRET5", "amqp://guest:xxxxx@127.0.0.1:5672/?auth_token=xxxxx", "SEKRET5"},
		{"redis://127.0.0.1:6379/0?password=SEKRET6", "redis://127.0.0.1:6379/0?password=xxxxx", "SEKRET6"},
	} {
		_, shown, err := serviceAddress(tc.url)
		if err != nil || shown != tc.shown {
			t.Errorf("serviceAddress(%q) shows %q, %v; want %q", tc.url, shown, err, tc.shown)
		}
		if strings.Contains(shown, tc.secret) {
			t.Errorf("serviceAddress(%q) shows the secret: %q", tc.url, shown)
		}
	}
	// Errors about a URL show it too.
	for _, raw := range []string{"unknown://u:SEKRET7@host?token=SEKRET8", "nats://SEKRET9@/x?token=SEKRET10"} {
		_, shown, err := serviceAddress(raw)
		if err == nil {
			t.Errorf("serviceAddress(%q) = nil error, want one", raw)
			continue
		}
		if strings.Contains(err.Error(), "SEKRET") || strings.Contains(shown, "SEKRET") {
			t.Errorf("serviceAddress(%q) error %q, shown %q: the secret is shown", raw, err, shown)
		}
	}
}
