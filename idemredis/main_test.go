package idemredis_test

import (
	"flag"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/idemtest"
)

const (
	redisEnv        = "IDEM_REDIS_URL"
	defaultRedisURL = "redis://127.0.0.1:6379/0"
)

// TestMain checks for goroutine leaks (the store runs a subscription
// goroutine, go-redis its health checks). Examples cannot skip themselves,
// so when Redis does not answer they are skipped here, with the reason,
// unless IDEM_REQUIRE_SERVICES=1 demands that they run (and fail).
func TestMain(m *testing.M) {
	flag.Parse()
	if reason := redisMissing(); reason != "" && os.Getenv(idemtest.RequireServicesEnv) != "1" {
		fmt.Fprintf(os.Stderr, "skipping the examples: %s; set %s=1 to fail instead\n", reason, idemtest.RequireServicesEnv)
		skip := "^Example"
		if old := flag.Lookup("test.skip").Value.String(); old != "" {
			skip = old + "|" + skip
		}
		if err := flag.Set("test.skip", skip); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	// A rueidis cluster client closes the connections of nodes that left
	// its view five seconds later, from a goroutine its Close does not
	// wait for.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

// redisMissing returns why Redis cannot be reached, or "".
func redisMissing() string {
	url := os.Getenv(redisEnv)
	if url == "" {
		url = defaultRedisURL
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Sprintf("%s is not a Redis URL", redisEnv)
	}
	conn, err := net.DialTimeout(opt.Network, opt.Addr, 2*time.Second)
	if err != nil {
		return fmt.Sprintf("Redis does not answer at %s: %v", opt.Addr, err)
	}
	conn.Close()
	return ""
}
