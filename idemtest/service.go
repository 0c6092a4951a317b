package idemtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/secreturl"
)

// RequireServicesEnv names the environment variable that turns a missing
// service from a skip into a failure. CI sets it to 1, so a test that needs
// PostgreSQL cannot pass there by skipping.
const RequireServicesEnv = "IDEM_REQUIRE_SERVICES"

// dialTimeout is how long RequireService waits for the service to accept a
// connection. A local service answers in microseconds; a missing one should
// not slow the run.
const dialTimeout = 2 * time.Second

// defaultPorts are the ports of the URL schemes idem's backends use, for
// URLs that do not name one.
var defaultPorts = map[string]string{
	"postgres":   "5432",
	"postgresql": "5432",
	"redis":      "6379",
	"rediss":     "6379",
	"nats":       "4222",
	"tls":        "4222",
	"amqp":       "5672",
	"amqps":      "5671",
	"mysql":      "3306",
	"http":       "80",
	"https":      "443",
}

// RequireService is the gate for tests that need an external service such
// as PostgreSQL, Redis, NATS or RabbitMQ. It reads the service's URL from the
// environment variable envVar (defaultURL when unset or empty) and dials its
// host and port with a short timeout.
//
// When the service answers, RequireService returns the URL. When it does
// not, the test is skipped with the reason, or fails if the environment
// variable IDEM_REQUIRE_SERVICES is 1. A URL that cannot be parsed always
// fails the test: it is a mistake, not a missing service.
//
// name is the service's name for messages ("PostgreSQL"). Messages show the
// URL with its secrets masked (a password, a NATS token, a secret query
// parameter such as ?password=), and never a URL that does not parse.
func RequireService(t testing.TB, name, envVar, defaultURL string) string {
	t.Helper()
	raw := os.Getenv(envVar)
	if raw == "" {
		raw = defaultURL
	}
	addr, shown, err := serviceAddress(raw)
	if err != nil {
		t.Fatalf("%s: bad URL in %s: %v", name, envVar, err)
		return ""
	}
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		reason := fmt.Sprintf("%s does not answer at %s (%s from %s): %v", name, addr, shown, envVar, err)
		if os.Getenv(RequireServicesEnv) == "1" {
			t.Fatalf("%s; %s=1 requires it", reason, RequireServicesEnv)
			return ""
		}
		t.Skipf("skipping: %s; set %s=1 to fail instead", reason, RequireServicesEnv)
		return ""
	}
	conn.Close()
	return raw
}

// serviceAddress returns the host:port to dial for a service URL, and the
// URL with its secrets masked for messages.
func serviceAddress(raw string) (addr, shown string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error quotes the whole URL, secrets included.
		return "", "", errors.New("cannot parse the URL (not shown, it may hold a secret)")
	}
	shown, err = secreturl.Redact(raw)
	if err != nil {
		return "", "", err
	}
	host := u.Hostname()
	if u.Scheme == "" || host == "" {
		return "", shown, fmt.Errorf("%s: want scheme://host[:port]", shown)
	}
	port := u.Port()
	if port == "" {
		port = defaultPorts[u.Scheme]
		if port == "" {
			return "", shown, fmt.Errorf("%s: no port, and scheme %q has no known default", shown, u.Scheme)
		}
	}
	return net.JoinHostPort(host, port), shown, nil
}
