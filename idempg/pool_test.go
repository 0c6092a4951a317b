package idempg_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// callersPool is a pool an application made itself, its connections'
// search_path set to a fresh schema, closed when the test ends.
func callersPool(t testing.TB, url string) (*pgxpool.Pool, string) {
	t.Helper()
	schema := freshSchema(t, url)
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeWithin(t, "the caller's pool", pool.Close) })
	return pool, schema
}

// borrowedDB is a DB on a pool of the caller's.
func borrowedDB(t testing.TB, url string, clock idem.Clock) *idempg.DB {
	t.Helper()
	pool, _ := callersPool(t, url)
	db, err := idempg.NewDB(t.Context(), pool, &idempg.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// The store on a pool of the caller's keeps every promise of the store,
// the same-transaction form's included.
func TestStoreOnCallersPool(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	t.Run("Store", func(t *testing.T) {
		t.Parallel()
		idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
			return newStore(t, borrowedDB(t, url, clock))
		})
	})
	t.Run("TxEffects", func(t *testing.T) {
		t.Parallel()
		idemtest.TestTxEffects(t, func(t *testing.T, clock idem.Clock) (idem.TxStore, idemtest.InboxEffects) {
			db := borrowedDB(t, url, clock)
			return newStore(t, db), newEffects(t, db)
		})
	})
	t.Run("WithTx", func(t *testing.T) {
		t.Parallel()
		idemtest.TestWithTx(t, func(t *testing.T, clock idem.Clock) (idemtest.TxRunner, idem.Store, idemtest.InboxEffects) {
			db := borrowedDB(t, url, clock)
			return txRunner{db}, newStore(t, db), newEffects(t, db)
		})
	})
	t.Run("Inbox", func(t *testing.T) {
		t.Parallel()
		idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
			db := borrowedDB(t, url, nil)
			in, err := idempg.NewInbox(t.Context(), db)
			if err != nil {
				t.Fatal(err)
			}
			return in, newEffects(t, db)
		})
	})
}

// idem's tables are made in the pool's schema, and Close leaves the pool
// open for the application.
func TestNewDBUsesThePoolAsItIs(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	pool, schema := callersPool(t, url)
	db, err := idempg.NewDB(t.Context(), pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if db.Schema() != schema || db.Pool() != pool {
		t.Fatalf("Schema %q, Pool %p; want %q and the caller's %p", db.Schema(), db.Pool(), schema, pool)
	}
	s, err := idempg.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'idem_keys'`, schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("idem_keys in %s: %d, %v", schema, n, err)
	}
	db.Close()
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatalf("the caller's pool after DB.Close: %v", err)
	}
}

func TestNewDBRefuses(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	pool, schema := callersPool(t, url)
	if _, err := idempg.NewDB(t.Context(), nil, nil); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("nil pool: %v, want ErrInvalidArgument", err)
	}
	if _, err := idempg.NewDB(t.Context(), pool, &idempg.Config{MaxConns: 8}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("MaxConns: %v, want ErrInvalidArgument", err)
	}
	_, err := idempg.NewDB(t.Context(), pool, &idempg.Config{Schema: "elsewhere"})
	if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), schema) {
		t.Errorf("another schema: %v, want ErrInvalidArgument naming %s", err, schema)
	}
	// A search_path whose schema does not exist.
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = randomName("idempg_missing_")
	pcfg.MaxConns = 1
	lost, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lost.Close()
	if _, err := idempg.NewDB(t.Context(), lost, nil); !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "search_path") {
		t.Errorf("missing schema: %v, want ErrInvalidArgument about the search_path", err)
	}
	// Nothing was made in the pool's schema by the refusals.
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("tables in %s after refusals: %d, %v", schema, n, err)
	}
}
