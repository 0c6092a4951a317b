package payments

// Helpers for tests that need the real PostgreSQL and Redis. They are
// exported so the external test package (payments_test) can use them too;
// they exist only in test builds.

import (
	"context"
	crand "crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

// randomName is prefix followed by random lower-case letters and digits:
// a valid unquoted PostgreSQL identifier and Redis key prefix.
func randomName(prefix string) string {
	return prefix + strings.ToLower(crand.Text()[:16])
}

// OpenPostgresForTest opens the test PostgreSQL on a fresh schema of its
// own, with clock deciding key expiry (nil: the database's clock), and
// drops the schema when the test ends. It skips (or fails, under
// IDEM_REQUIRE_SERVICES=1) when PostgreSQL does not answer.
func OpenPostgresForTest(t testing.TB, clock idem.Clock) *idempg.DB {
	t.Helper()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	schema := randomName("payments_test_")
	// Registered first, so it runs last: after the DB and whatever uses it
	// are closed.
	t.Cleanup(func() {
		// The test's context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	// The machine's PostgreSQL is shared by every test beside this one:
	// each opens a small pool.
	db, err := idempg.Open(context.Background(), url, &idempg.Config{Schema: schema, Clock: clock, MaxConns: 8})
	if err != nil {
		t.Fatalf("idempg.Open: %v", err)
	}
	t.Cleanup(db.Close)
	return db
}

// OpenRedisKeysForTest opens an idemredis store on the test Redis under a
// fresh key prefix, with clock deciding leases and expiry (nil: the Redis
// server's clock), and deletes the prefix's keys when the test ends. It
// skips (or fails, under IDEM_REQUIRE_SERVICES=1) when Redis does not
// answer.
func OpenRedisKeysForTest(t testing.TB, clock idem.Clock) *idemredis.Store {
	t.Helper()
	url := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("IDEM_REDIS_URL: %v", err)
	}
	client := redis.NewClient(opts)
	prefix := randomName("paytest")
	t.Cleanup(func() {
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+":*", 500).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting the keys of prefix %s: %v", prefix, err)
		}
	})
	store, err := idemredis.NewStore(context.Background(), client, &idemredis.Config{Prefix: prefix, Clock: clock})
	if err != nil {
		t.Fatalf("idemredis.NewStore: %v", err)
	}
	t.Cleanup(func() {
		if err := store.Close(); err != nil {
			t.Errorf("closing the Redis store: %v", err)
		}
	})
	return store
}
