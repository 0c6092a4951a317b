package idempg_test

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/idemtest"
)

// TestMain checks that closing the stores and DBs stopped every goroutine:
// pgxpool's health checks and the stores' LISTEN loops.
//
// The examples need PostgreSQL, and an example cannot skip itself the way
// the tests do (idemtest.RequireService): when PostgreSQL does not answer
// and IDEM_REQUIRE_SERVICES is not 1, and no -run was given, they are left
// out of the run, with a note saying so.
func TestMain(m *testing.M) {
	flag.Parse()
	if run := flag.Lookup("test.run"); run.Value.String() == "" &&
		os.Getenv(idemtest.RequireServicesEnv) != "1" && !postgresAnswers() {
		fmt.Fprintln(os.Stderr, "idempg: PostgreSQL does not answer: the examples are not run, the tests skip")
		run.Value.Set("^Test")
	}
	goleak.VerifyTestMain(m)
}

// postgresAnswers reports whether the test PostgreSQL accepts connections.
func postgresAnswers() bool {
	raw := os.Getenv("IDEM_POSTGRES_URL")
	if raw == "" {
		raw = defaultPostgresURL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(u.Hostname(), port), 2*time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
