package storetest_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for idempgsql
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idempgsql"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

const (
	defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// The suite on SQLite, where the key is claimed in the handler's
// transaction (idem.TxClaimer).
func TestSQLite(t *testing.T) {
	t.Parallel()
	grpcsuite.Run(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return sqliteStore(t, openSQLite(t), clock)
	})
}

// The suite on PostgreSQL (idem.TxClaimer: the claim in the handler's
// transaction, duplicates of other processes waiting in the database).
func TestPostgres(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
	grpcsuite.Run(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return pgStore(t, openPG(t, url, clock))
	})
}

// The suite on Redis, in the separate form (no shared transaction).
func TestRedis(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", defaultRedisURL)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() { client.Close() })
	grpcsuite.Run(t, func(t *testing.T, clock idem.Clock) idem.Store {
		prefix := randomName("idemgrpc-test-")
		s, err := idemredis.NewStore(t.Context(), client, &idemredis.Config{Prefix: prefix, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s.Close()
			deleteKeys(t, client, prefix)
		})
		return s
	})
}

func openSQLite(t *testing.T) *idemsqlite.DB {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func sqliteStore(t *testing.T, db *idemsqlite.DB, clock idem.Clock) *idemsqlite.Store {
	t.Helper()
	s, err := idemsqlite.NewStore(t.Context(), db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func openPG(t *testing.T, url string, clock idem.Clock) *idempg.DB {
	t.Helper()
	schema := randomName("idemgrpc_test_")
	t.Cleanup(func() { dropSchema(t, url, schema) })
	// The machine's PostgreSQL is shared: keep each test's share small.
	db, err := idempg.Open(t.Context(), url, &idempg.Config{Schema: schema, Clock: clock, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

func pgStore(t *testing.T, db *idempg.DB) *idempg.Store {
	t.Helper()
	s, err := idempg.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func dropSchema(t *testing.T, url, schema string) {
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
}

func deleteKeys(t *testing.T, client *redis.Client, prefix string) {
	// t.Context is already cancelled when cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := client.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Errorf("listing the test's keys: %v", err)
		return
	}
	if len(keys) > 0 {
		if err := client.Unlink(ctx, keys...).Err(); err != nil {
			t.Errorf("deleting the test's keys: %v", err)
		}
	}
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// start is when the tests' clocks start.
var start = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)

// pgsqlStore is an idempgsql store on a fresh schema (the connections'
// search_path), through pgx's database/sql driver, with at most 4
// connections: the machine's PostgreSQL is shared.
func pgsqlStore(t *testing.T, url string, clock idem.Clock) *idempgsql.Store {
	t.Helper()
	schema := randomName("idemgrpc_test_")
	t.Cleanup(func() { dropSchema(t, url, schema) })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	sqlDB, err := sql.Open("pgx", url+sep+"search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(4)
	t.Cleanup(func() { sqlDB.Close() })
	db, err := idempgsql.NewDB(t.Context(), sqlDB, &idempgsql.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	s, err := idempgsql.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
