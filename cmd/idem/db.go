package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/internal/secreturl"
)

// defaultDB is where the service keeps its data unless told otherwise: a
// file beside the working directory, so `idem serve` works with no setup.
const defaultDB = "sqlite:idem.db"

const supportedDBs = "sqlite:PATH, sqlite://PATH or postgres://USER@HOST/DB (postgresql:// too)"

// Defaults of the flags that go with --db and --keys.
const (
	defaultPGSchema   = "idem"
	defaultKeysPrefix = "idem"
)

// dbTarget is a parsed --db value.
type dbTarget struct {
	// postgres is set for a PostgreSQL URL; else path names a SQLite file.
	postgres bool
	path     string
	url      string
	// shown is what messages may say: the path, or the URL, with its
	// secrets masked (secreturl.Redact); flag is the whole --db value so
	// masked, for messages that suggest a command line.
	shown, flag string
}

// parseDB parses a --db value. It never echoes a secret of the value: a
// database URL may carry a password, in its user-info or its query.
func parseDB(s string) (dbTarget, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/\\. ") {
		return dbTarget{}, fmt.Errorf("--db needs a scheme; supported: %s (for example %s)", supportedDBs, defaultDB)
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return dbTarget{}, fmt.Errorf("--db sqlite: needs a file path; supported: %s", supportedDBs)
		}
		// A SQLite name is redacted without parsing (it is a file path), so
		// this never fails.
		flag, err := secreturl.Redact(s)
		if err != nil {
			return dbTarget{}, fmt.Errorf("--db: %w", err)
		}
		shown := strings.TrimPrefix(strings.TrimPrefix(flag, "sqlite:"), "//")
		return dbTarget{path: path, url: s, shown: shown, flag: flag}, nil
	case "postgres", "postgresql":
		shown, err := secreturl.Redact(s)
		if err != nil {
			return dbTarget{}, fmt.Errorf("--db: %w", err)
		}
		return dbTarget{postgres: true, url: s, shown: shown, flag: shown}, nil
	default:
		return dbTarget{}, fmt.Errorf("--db: unsupported database scheme %q; supported: %s", scheme, supportedDBs)
	}
}

// dbFlags adds --db and --pg-schema to cmd.
func dbFlags(cmd *cobra.Command, dbURL, pgSchema *string) {
	cmd.Flags().StringVar(dbURL, "db", defaultDB, "database: "+supportedDBs)
	cmd.Flags().StringVar(pgSchema, "pg-schema", defaultPGSchema, "PostgreSQL schema for the tables (with --db postgres://…)")
}

// keysFlags adds --keys and --keys-prefix to cmd.
func keysFlags(cmd *cobra.Command, keysURL, prefix *string) {
	cmd.Flags().StringVar(keysURL, "keys", "", "separate store for the idempotency keys: redis://HOST:PORT/DB (rediss:// too); default: the --db database")
	cmd.Flags().StringVar(prefix, "keys-prefix", defaultKeysPrefix, "prefix of the Redis keys (with --keys redis://…)")
}

// database is an open --db database: exactly one of sqlite and pg is set.
type database struct {
	sqlite *idemsqlite.DB
	pg     *idempg.DB
	// pool is pg's pool when it is openDBToRead's, which pg leaves open.
	pool *pgxpool.Pool
	// shown names it in messages, without its secrets.
	shown string
}

func (d *database) Close() error {
	if d.pg != nil {
		d.pg.Close()
		if d.pool != nil {
			d.pool.Close()
		}
		return nil
	}
	return d.sqlite.Close()
}

// openDBToRead opens the database named by a --db value for a tool that
// only reads it (reconcile): a SQLite file must exist, and a PostgreSQL
// schema too, and nothing is created in either. idempg.Open creates a
// missing schema; here the connections are read-only
// (default_transaction_read_only), so that no statement of the tool, or of
// what it calls, can write, and a missing schema is an error that says so.
func openDBToRead(ctx context.Context, dbURL, pgSchema string) (*database, error) {
	t, err := parseDB(dbURL)
	if err != nil {
		return nil, err
	}
	if !t.postgres {
		return openDB(ctx, dbURL, pgSchema, true)
	}
	pcfg, err := pgxpool.ParseConfig(t.url)
	if err != nil {
		return nil, fmt.Errorf("opening PostgreSQL %s: %w", t.shown, secreturl.Scrub(err, t.url))
	}
	pcfg.MaxConns = 4
	pcfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{pgSchema}.Sanitize()
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("opening PostgreSQL %s: %w", t.shown, secreturl.Scrub(err, t.url))
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, pgSchema).Scan(&exists); err != nil {
		pool.Close()
		return nil, fmt.Errorf("opening PostgreSQL %s: %w", t.shown, secreturl.Scrub(err, t.url))
	}
	if !exists {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL %s has no schema %s: this tool only reads, and creates nothing; point --db and --pg-schema at the service's database, or run 'idem migrate' on it first", t.shown, pgSchema)
	}
	db, err := idempg.NewDB(ctx, pool, &idempg.Config{Schema: pgSchema})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("opening PostgreSQL %s (schema %s): %w", t.shown, pgSchema, secreturl.Scrub(err, t.url))
	}
	return &database{pg: db, pool: pool, shown: fmt.Sprintf("%s (schema %s)", t.shown, pgSchema)}, nil
}

// openDB opens the database named by a --db value (pgSchema is its schema
// when it is PostgreSQL). With mustExist, a SQLite file that is not there is
// an error instead of a new, empty database: tools that inspect data should
// not create it by mistake.
func openDB(ctx context.Context, dbURL, pgSchema string, mustExist bool) (*database, error) {
	t, err := parseDB(dbURL)
	if err != nil {
		return nil, err
	}
	if t.postgres {
		db, err := idempg.Open(ctx, t.url, &idempg.Config{Schema: pgSchema})
		if err != nil {
			return nil, fmt.Errorf("opening PostgreSQL %s (schema %s): %w", t.shown, pgSchema, secreturl.Scrub(err, t.url))
		}
		return &database{pg: db, shown: fmt.Sprintf("%s (schema %s)", t.shown, pgSchema)}, nil
	}
	if mustExist {
		if _, err := os.Stat(t.path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("database %s does not exist (create it with 'idem migrate --db %s')", t.shown, t.flag)
		}
	}
	db, err := idemsqlite.Open(t.path, nil)
	if err != nil {
		return nil, fmt.Errorf("opening database %s: %w", t.shown, secreturl.Scrub(err, t.url))
	}
	return &database{sqlite: db, shown: t.shown}, nil
}

// keysTarget is a parsed --keys value.
type keysTarget struct {
	url, shown string
}

// parseKeys parses a --keys value. Like parseDB, it never echoes a
// secret.
func parseKeys(s string) (keysTarget, error) {
	scheme, _, ok := strings.Cut(s, "://")
	switch {
	case !ok:
		return keysTarget{}, errors.New("--keys needs a URL: redis://HOST:PORT/DB or rediss://HOST:PORT/DB")
	case !strings.EqualFold(scheme, "redis") && !strings.EqualFold(scheme, "rediss"):
		if strings.ContainsAny(scheme, "@:/") {
			return keysTarget{}, errors.New("--keys: unsupported key store; supported: redis://HOST:PORT/DB, rediss://HOST:PORT/DB")
		}
		return keysTarget{}, fmt.Errorf("--keys: unsupported key store scheme %q; supported: redis://HOST:PORT/DB, rediss://HOST:PORT/DB", scheme)
	}
	shown, err := secreturl.Redact(s)
	if err != nil {
		return keysTarget{}, fmt.Errorf("--keys: %w", err)
	}
	return keysTarget{url: s, shown: shown}, nil
}

// openKeys opens the Redis key store named by a --keys value.
func openKeys(ctx context.Context, keysURL, prefix string) (*idemredis.Store, keysTarget, error) {
	t, err := parseKeys(keysURL)
	if err != nil {
		return nil, t, err
	}
	s, err := idemredis.Open(ctx, t.url, &idemredis.Config{Prefix: prefix})
	if err != nil {
		return nil, t, fmt.Errorf("opening the Redis key store %s: %w", t.shown, secreturl.Scrub(err, t.url))
	}
	return s, t, nil
}

// keyStore opens the idempotency key store the tools work on: the Redis
// one when keysURL is set, else the one in the database. The returned
// function closes what it opened, the database included.
func keyStore(ctx context.Context, dbURL, pgSchema, keysURL, prefix string) (idem.Store, func() error, error) {
	if keysURL != "" {
		rs, _, err := openKeys(ctx, keysURL, prefix)
		if err != nil {
			return nil, nil, err
		}
		return rs, rs.Close, nil
	}
	db, err := openDB(ctx, dbURL, pgSchema, true)
	if err != nil {
		return nil, nil, err
	}
	if db.pg != nil {
		s, err := idempg.NewStore(ctx, db.pg)
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("opening the idempotency store: %w", err), db.Close())
		}
		return s, func() error { s.Close(); return db.Close() }, nil
	}
	s, err := idemsqlite.NewStore(ctx, db.sqlite, nil)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("opening the idempotency store: %w", err), db.Close())
	}
	return s, db.Close, nil
}

// checkPGSchema refuses --pg-schema without a PostgreSQL --db, where it
// would be silently ignored.
func checkPGSchema(cmd *cobra.Command, dbURL string) error {
	if !cmd.Flags().Changed("pg-schema") {
		return nil
	}
	if t, err := parseDB(dbURL); err == nil && !t.postgres {
		return errors.New("--pg-schema applies only to --db postgres://…")
	}
	return nil
}
