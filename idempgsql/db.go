package idempgsql

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlmigrate"
)

// Config configures NewDB. The zero value is ready to use.
type Config struct {
	// Schema, when set, must be the schema the connections use first
	// (their current_schema()): idem's statements name their tables
	// unqualified, so that is where its tables live. It is checked, not
	// applied: set the connections' search_path where the *sql.DB is made
	// (the connection string's search_path or options). Empty: whatever
	// that schema is.
	Schema string
	// Clock, when set, decides leases and expiry: its time is passed to
	// every statement as a parameter. Tests inject a manual clock. Defaults
	// to nil: the database's clock (clock_timestamp()) decides, so replicas
	// whose clocks disagree still agree on when a lease ends.
	Clock idem.Clock
	// TxOptions are the options of the transactions that WithTx,
	// Store.CompleteTx and Inbox.Process begin. Nil means READ COMMITTED,
	// read-write, whatever the server's default_transaction_isolation.
	// Every level keeps the promises (a key executed once, a message
	// processed once), and Process and CompleteTx answer alike at each:
	// where REPEATABLE READ or SERIALIZABLE fails one of their statements
	// with a serialization failure because another transaction committed
	// after the snapshot, Process begins again and CompleteTx looks at
	// the key anew (see the package documentation, "Isolation levels").
	TxOptions *sql.TxOptions
}

// DB is idem's view of a PostgreSQL database reached through database/sql:
// the application's *sql.DB, the schema its connections use, and the
// transactions a context carries (WithTx, JoinTx). It is safe for
// concurrent use. It owns nothing that needs closing: the *sql.DB stays
// the application's.
type DB struct {
	sql    *sql.DB
	schema string
	// identity names the server (its start time), the database and the
	// schema the connections reach: two DBs with one identity work on the
	// same tables, so each joins the other's transactions.
	identity  string
	channel   string
	clock     idem.Clock
	txOptions sql.TxOptions
}

// NewDB returns a DB on db, a *sql.DB of any PostgreSQL driver: pgx's
// (github.com/jackc/pgx/v5/stdlib, driver name "pgx") or lib/pq's
// ("postgres"). cfg may be nil.
//
// Every statement of idem names its tables unqualified, so idem's tables
// live in the schema the connections use first: their current_schema(),
// "public" unless the connection string sets a search_path. NewDB reads it;
// it must be a plain identifier of at most 53 bytes. The tables, created by
// NewStore, NewInbox and NewOutbox, are all named idem_*, and they are the
// very tables of idempg: the two packages can work on one schema at once.
//
// Returns an error matching idem.ErrInvalidArgument when db is nil or cfg
// is refused, and the database's error when the schema cannot be read.
func NewDB(ctx context.Context, db *sql.DB, cfg *Config) (*DB, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if db == nil {
		return nil, &idem.ArgumentError{Field: "db", Reason: "is required"}
	}
	var current sql.NullString
	var database, started string
	if err := db.QueryRowContext(ctx, `SELECT current_schema(), current_database(), extract(epoch FROM pg_postmaster_start_time())::text`).
		Scan(&current, &database, &started); err != nil {
		return nil, fmt.Errorf("idempgsql: reading the connections' schema: %w", err)
	}
	if !current.Valid {
		return nil, &idem.ArgumentError{Field: "db", Reason: "its connections' search_path names no schema that exists: " +
			"create the schema, or set search_path in the connection string"}
	}
	if c.Schema != "" && c.Schema != current.String {
		return nil, &idem.ArgumentError{Field: "Schema", Reason: fmt.Sprintf("is %q, but the connections use %q first (their search_path): "+
			"idem's tables live in the schema the connections use; leave Schema empty, or set the connections' search_path", c.Schema, current.String)}
	}
	if err := pgsql.ValidateSchema(current.String); err != nil {
		return nil, err
	}
	d := &DB{sql: db, schema: current.String, channel: current.String + pgsql.ChannelSuffix, clock: c.Clock,
		identity:  started + "\x00" + database + "\x00" + current.String,
		txOptions: sql.TxOptions{Isolation: sql.LevelReadCommitted}}
	if c.TxOptions != nil {
		d.txOptions = *c.TxOptions
	}
	return d, nil
}

// SQL returns the *sql.DB the DB was made on. Statements run on it
// directly commit on their own: inside WithTx's fn use the *sql.Tx it is
// given instead.
func (db *DB) SQL() *sql.DB { return db.sql }

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

// wake wakes the waiters of a key (idempg's Store.WaitChange, on the same
// schema), if it has any, with a statement on q.
func (db *DB) wake(ctx context.Context, q querier, scope idem.Scope, key idem.Key) error {
	_, err := q.ExecContext(ctx, pgsql.Wake, db.channel, pgsql.NotifyID(scope, key), string(scope), string(key))
	return err
}

// Migrate applies the migrations of component that are not applied yet, in
// the DB's schema, exactly as idempg's DB.Migrate does (the two record them
// in one table, idem_schema_migrations, under the same locks):
//
// migrations holds, at its root, files named NNNN_description.sql, applied
// in the numeric order of NNNN. Each file runs in its own transaction
// together with its record, so a file either applies completely and is
// recorded, or leaves no trace: a failure returns an error naming the file,
// and the next Migrate retries it. Each file's transaction first takes
// pg_advisory_xact_lock on a key derived from the schema and component,
// then checks whether the file is applied, so processes migrating at once
// all succeed and each file runs once. A file may hold several statements
// where the driver runs them in one call without arguments (lib/pq and pgx
// both do), but none that cannot run in a transaction.
//
// The application migrates its own tables the same way, under its own
// component name.
func (db *DB) Migrate(ctx context.Context, component string, migrations fs.FS) error {
	if component == "" {
		return &idem.ArgumentError{Field: "component", Reason: "must not be empty"}
	}
	if db.carried(ctx) != nil {
		return &idem.ArgumentError{Field: "ctx", Reason: "must not carry a transaction: Migrate runs its own"}
	}
	list, err := sqlmigrate.List(migrations)
	if err != nil {
		return fmt.Errorf("idempgsql: migrate %s: %w", component, err)
	}
	if err := db.createMigrationsTable(ctx); err != nil {
		return fmt.Errorf("idempgsql: migrate %s: %w", component, err)
	}
	done, err := db.appliedVersions(ctx, component)
	if err != nil {
		return fmt.Errorf("idempgsql: migrate %s: %w", component, err)
	}
	for _, m := range list {
		if done[m.Version] {
			continue
		}
		if err := db.applyMigration(ctx, component, migrations, m); err != nil {
			return fmt.Errorf("idempgsql: migrate %s: %s: %w", component, m.Name, err)
		}
	}
	return nil
}

func (db *DB) createMigrationsTable(ctx context.Context) error {
	var exists bool
	if err := db.sql.QueryRowContext(ctx, pgsql.MigrationsTableExists).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	// Every component shares the table, so its creation is serialized
	// under the schema's own lock, not a component's.
	return db.inOwnTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, pgsql.AdvisoryLock, pgsql.LockKey(db.schema, "")); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, pgsql.CreateMigrationsTable)
		return err
	})
}

func (db *DB) appliedVersions(ctx context.Context, component string) (map[int64]bool, error) {
	rows, err := db.sql.QueryContext(ctx, pgsql.AppliedVersions, component)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := make(map[int64]bool)
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}

func (db *DB) applyMigration(ctx context.Context, component string, fsys fs.FS, m sqlmigrate.File) error {
	script, err := fs.ReadFile(fsys, m.Name)
	if err != nil {
		return err
	}
	return db.inOwnTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, pgsql.AdvisoryLock, pgsql.LockKey(db.schema, component)); err != nil {
			return err
		}
		// Checked under the lock: another process may have applied the
		// file while this one waited.
		var applied bool
		if err := tx.QueryRowContext(ctx, pgsql.MigrationApplied, component, m.Version).Scan(&applied); err != nil {
			return err
		}
		if applied {
			return nil
		}
		if strings.TrimSpace(string(script)) != "" {
			// Without arguments both drivers send the script over the
			// simple protocol, which runs several statements.
			if _, err := tx.ExecContext(ctx, string(script)); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, pgsql.RecordMigration, component, m.Version, m.Name)
		return err
	})
}

// inOwnTx runs fn in a transaction of its own, not one a context carries,
// and commits it when fn returns nil.
func (db *DB) inOwnTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := db.sql.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
