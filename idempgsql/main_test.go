package idempgsql_test

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

// TestMain checks that closing the *sql.DBs stopped every goroutine.
//
// The examples need PostgreSQL, and an example cannot skip itself the way
// the tests do (idemtest.RequireService): when PostgreSQL does not answer
// and IDEM_REQUIRE_SERVICES is not 1, and no -run was given, they are left
// out of the run, with a note saying so.
func TestMain(m *testing.M) {
	flag.Parse()
	if run := flag.Lookup("test.run"); run.Value.String() == "" &&
		os.Getenv(idemtest.RequireServicesEnv) != "1" && !postgresAnswers() {
		fmt.Fprintln(os.Stderr, "idempgsql: PostgreSQL does not answer: the examples are not run, the tests skip")
		run.Value.Set("^Test")
	}
	goleak.VerifyTestMain(m)
}

// postgresAnswers reports whether the test PostgreSQL accepts connections.
func postgresAnswers() bool {
	u, err := url.Parse(postgresURL())
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

// postgresURL is the test PostgreSQL: IDEM_POSTGRES_URL, or the machine's.
func postgresURL() string {
	if raw := os.Getenv("IDEM_POSTGRES_URL"); raw != "" {
		return raw
	}
	return defaultPostgresURL
}

const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
