package idempg

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/secreturl"
)

// DefaultSchema is the schema Open uses when Config.Schema is empty.
const DefaultSchema = "idem"

// Config configures Open. The zero value is ready to use.
type Config struct {
	// Schema is the PostgreSQL schema that holds idem's tables and the
	// application's: Open creates it if it is missing, and sets every
	// connection's search_path to it alone, so migrations and queries use
	// unqualified table names. It must be a plain identifier (letters,
	// digits and underscores, not starting with a digit, at most 53
	// bytes, not starting with "pg_"); letters keep their case. Defaults
	// to "idem".
	Schema string
	// Clock, when set, decides leases and expiry: its time is passed to
	// every statement as a parameter. Tests inject a manual clock. Defaults
	// to nil: the database's clock (clock_timestamp()) decides, so replicas
	// whose clocks disagree still agree on when a lease ends.
	Clock idem.Clock
	// MaxConns is the most connections the pool opens. The store's
	// LISTEN connection (see Store.WaitChange) comes on top. Defaults to
	// pool_max_conns in the URL, and without it to the larger of 16 and
	// four per CPU: pgxpool's own default (4 on a small machine) starves a
	// service whose requests, outbox relay, consumer batches and waiting
	// duplicates share the pool (measured: 1,150 payments/s on 4
	// connections, 1,400 to 1,700 on 16, with 64 clients on 2 CPUs).
	MaxConns int32
	// TxOptions are the options of the transactions that WithTx and
	// Store.CompleteTx begin: the isolation level the application's
	// writes run at. An empty IsoLevel means READ COMMITTED, whatever the
	// server's default_transaction_isolation. Any level is safe for the
	// keys: a claim commits before the work runs, and the completion is a
	// compare-and-set on the fencing token. BeginQuery and CommitQuery,
	// when set, replace the statements that begin and commit them.
	// Defaults to READ COMMITTED, read-write.
	TxOptions pgx.TxOptions
}

// DB is a pgx connection pool on one schema of a PostgreSQL database, with
// transactions that a context carries (WithTx) and schema migrations
// (Migrate). It is safe for concurrent use.
type DB struct {
	pool   *pgxpool.Pool
	schema string
	clock  idem.Clock
	// beginSQL and commitSQL begin and commit the transactions of WithTx
	// and Store.CompleteTx, as Config.TxOptions say.
	beginSQL, commitSQL string
	// readCommitted says that those transactions run at READ COMMITTED, so
	// that each of their statements sees what committed before it began
	// (Store.ClaimTx relies on it to claim a key by its lock).
	readCommitted bool
	// namedStatements says that the connections run their statements
	// prepared (pgx's default exec mode, which a URL's
	// default_query_exec_mode may change, for a pooler that keeps no
	// prepared statements): Store.Replay then runs its own, prepared once
	// per connection under a name.
	namedStatements bool
	// borrowed says that the pool is the caller's (NewDB): Close leaves it
	// open.
	borrowed bool
}

// Open connects to the PostgreSQL database at url (a postgres:// URL or a
// key=value connection string, as pgx accepts), pings it, and creates
// cfg.Schema if it does not exist. cfg may be nil.
//
// Creating the schema needs the CREATE privilege on the database only when
// the schema is missing; concurrent Opens of one new schema from several
// processes all succeed.
func Open(ctx context.Context, url string, cfg *Config) (*DB, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if err := pgsql.ValidateSchema(c.Schema); err != nil {
		return nil, err
	}
	if c.MaxConns < 0 {
		return nil, &idem.ArgumentError{Field: "MaxConns", Reason: "must not be negative"}
	}
	if c.TxOptions.IsoLevel == "" {
		c.TxOptions.IsoLevel = pgx.ReadCommitted
	}

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx masks password and sslpassword in the URL it quotes, but no
		// other secret.
		return nil, &idem.ArgumentError{Field: "url", Reason: secreturl.Scrub(err, url).Error()}
	}
	switch {
	case c.MaxConns > 0:
		pcfg.MaxConns = c.MaxConns
	case !strings.Contains(url, "pool_max_conns"):
		pcfg.MaxConns = int32(max(16, 4*runtime.NumCPU()))
	}
	// Set at connection start, so no connection of the pool can ever run a
	// statement against another schema, and no extra round trip is spent.
	pcfg.ConnConfig.RuntimeParams["search_path"] = quoteIdent(c.Schema)
	watchDeaths(pcfg)

	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("idempg: open: %w", secreturl.Scrub(err, url))
	}
	db := newDB(pool, c)
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("idempg: open: %w", secreturl.Scrub(err, url))
	}
	if err := db.createSchema(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("idempg: open: schema %s: %w", c.Schema, err)
	}
	return db, nil
}

// newDB is a DB on pool, in c.Schema, with c's transactions.
func newDB(pool *pgxpool.Pool, c Config) *DB {
	db := &DB{pool: pool, schema: c.Schema, clock: c.Clock, beginSQL: beginSQL(c.TxOptions), commitSQL: "commit",
		readCommitted:   c.TxOptions.IsoLevel == pgx.ReadCommitted && c.TxOptions.BeginQuery == "",
		namedStatements: pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement}
	if c.TxOptions.CommitQuery != "" {
		db.commitSQL = c.TxOptions.CommitQuery
	}
	return db
}

// NewDB returns a DB on a pool the application already has, so that
// idem's statements and the application's share its connections, and a
// key's record or an inbox row can commit in the application's own pgx
// transaction (see DB.WithTx). The pool stays the caller's: Close leaves it
// open, and its configuration is used as it is. cfg may be nil.
//
// Every statement of idem names its tables unqualified, so idem's tables
// live in the schema the pool's connections use first: their
// current_schema(), which is "public" unless the pool's config sets a
// search_path (ConnConfig.RuntimeParams["search_path"]). NewDB reads it;
// cfg.Schema, when set, must be that schema (a mistake otherwise: idem
// would not find its tables where the caller expects them), and it must be
// a plain identifier of at most 53 bytes, as Open's. The tables are all
// named idem_*, beside the application's. cfg.MaxConns must be zero: the
// pool's size is the caller's to choose.
//
// A pool that Open makes pings, before handing it out, a connection that
// may have died with its server (a restart, a failover); a pool of the
// caller's hands connections out as its own configuration says.
//
// Returns an error matching idem.ErrInvalidArgument when pool is nil or cfg
// is refused, and the database's error when the schema cannot be read.
func NewDB(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*DB, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if pool == nil {
		return nil, &idem.ArgumentError{Field: "pool", Reason: "is required"}
	}
	if c.MaxConns != 0 {
		return nil, &idem.ArgumentError{Field: "MaxConns", Reason: "must be zero for a pool of the caller's: its size is set where the pool is made"}
	}
	if c.TxOptions.IsoLevel == "" {
		c.TxOptions.IsoLevel = pgx.ReadCommitted
	}
	var current *string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil {
		return nil, fmt.Errorf("idempg: reading the pool's schema: %w", err)
	}
	if current == nil {
		return nil, &idem.ArgumentError{Field: "pool", Reason: "its connections' search_path names no schema that exists: " +
			"create the schema, or set search_path in the pool's config (ConnConfig.RuntimeParams)"}
	}
	if c.Schema != "" && c.Schema != *current {
		return nil, &idem.ArgumentError{Field: "Schema", Reason: fmt.Sprintf("is %q, but the pool's connections use %q first (their search_path): "+
			"idem's tables live in the schema the connections use; leave Schema empty, or set the pool's search_path", c.Schema, *current)}
	}
	c.Schema = *current
	if err := pgsql.ValidateSchema(c.Schema); err != nil {
		return nil, err
	}
	db := newDB(pool, c)
	db.borrowed = true
	return db, nil
}

// quoteIdent quotes a validated identifier, so that its case is kept.
func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

func (db *DB) createSchema(ctx context.Context) error {
	var exists bool
	if err := db.pool.QueryRow(ctx,
		`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, db.schema).Scan(&exists); err != nil {
		return err
	}
	if exists {
		// Checked first: CREATE SCHEMA IF NOT EXISTS needs the CREATE
		// privilege even when the schema is there.
		return nil
	}
	// Two sessions running CREATE SCHEMA IF NOT EXISTS at once can both
	// miss the other's schema and one then fails on pg_namespace's unique
	// index; the lock makes the second wait and find it.
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pgsql.AdvisoryLock, pgsql.LockKey(db.schema, "")); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+quoteIdent(db.schema))
		return err
	})
}

// Close closes the pool, waiting for connections in use to be given back,
// unless the pool is the caller's (NewDB): that one stays open. Close
// every Store of the DB first.
func (db *DB) Close() {
	if !db.borrowed {
		db.pool.Close()
	}
}

// Pool returns the connection pool. Its connections use the DB's schema.
// Statements run on it directly commit on their own: inside WithTx's fn use
// the pgx.Tx it is given instead.
func (db *DB) Pool() *pgxpool.Pool { return db.pool }

// Schema returns the schema the DB works in.
func (db *DB) Schema() string { return db.schema }

// now returns the time parameter of a statement: the injected clock's time,
// or nil, for which the SQL reads the database's clock.
func (db *DB) now() any {
	if db.clock == nil {
		return nil
	}
	return db.clock.Now()
}
