package payments_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// With the keys in Redis, a key store that fails over can lose a claim
// whose payment the database kept; the retry then claims the key anew.
// The service finds the payment the lost claim made and answers with it:
// nothing is charged twice. A different body under the key is refused.
// (TestClusterRedisFailover loses claims the way a failover does; here the
// key's records are deleted, which is what the retry then sees.)
func TestLostClaimPaysOnce(t *testing.T) {
	forEachBackend(t, []backend{onSQLiteRedis, onPostgresRedis}, func(t *testing.T, b backend) {
		e := newEnvClocked(t, b, nil, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		key := "lost-claim-" + rand.Text()
		first := e.expect(req{method: "POST", path: "/v1/payments", idemKey: key, body: payBody(acct.ID, 700, "KRW")}, http.StatusCreated)

		forgetRedisKeys(t, key)
		// Another replica, which has not seen the key completed.
		r := e.replica()
		again := r.expect(req{method: "POST", path: "/v1/payments", idemKey: key, body: payBody(acct.ID, 700, "KRW")}, http.StatusCreated)
		if decode[payment](t, again).ID != decode[payment](t, first).ID {
			t.Fatalf("the retry after a lost claim made payment %s, the first was %s", again, first)
		}
		if again.header.Get(idemhttp.HeaderReplayed) == "true" {
			t.Fatalf("the key's record was gone, yet the answer says replayed")
		}
		r.expectPayments(keyA, acct.ID, 1)
		r.expectBalance(keyA, acct.ID, 10_000-700)

		forgetRedisKeys(t, key)
		r2 := e.replica()
		other := r2.do(req{method: "POST", path: "/v1/payments", idemKey: key, body: payBody(acct.ID, 900, "KRW")})
		if other.status < 400 || other.status >= 500 {
			t.Fatalf("another body under the key after a lost claim: %s, want a refusal", other)
		}
		r2.expectPayments(keyA, acct.ID, 1)
		r2.expectBalance(keyA, acct.ID, 10_000-700)
	})
}

// forgetRedisKeys deletes every Redis record whose name holds key, as a
// failover that lost them would.
func forgetRedisKeys(t *testing.T, key string) {
	t.Helper()
	url := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	iter := c.Scan(ctx, 0, "*"+key+"*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := c.Del(ctx, iter.Val()).Err(); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("no Redis record holds key %s", key)
	}
}
