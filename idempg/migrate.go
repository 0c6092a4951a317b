package idempg

import (
	"context"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
	"github.com/idem-go/idem/internal/sqlmigrate"
)

type migration = sqlmigrate.File

// Migrate applies the migrations of component that are not applied yet, in
// the DB's schema.
//
// migrations holds, at its root, files named NNNN_description.sql, applied
// in the numeric order of NNNN (so 10_x.sql runs after 9_y.sql). Each file
// runs in its own transaction together with its record in the table
// idem_schema_migrations(component, version, name, applied_at) of the
// schema, so a file either applies completely and is recorded, or leaves no
// trace (PostgreSQL's DDL is transactional): a failure returns an error
// naming the file, and the next Migrate retries it. A file may hold several
// statements, but none that cannot run in a transaction (CREATE INDEX
// CONCURRENTLY, VACUUM).
//
// Each file's transaction first takes pg_advisory_xact_lock on a key
// derived from the schema and component, then checks whether the file is
// applied. Several processes migrating the same schema at once (replicas
// starting together) therefore all succeed, and each file runs once: the
// others wait for the lock, then find it applied. Applied migrations are
// never run again, which makes Migrate safe to call on every start; when
// everything is applied it takes no lock.
//
// component names whose schema this is ("idem_keys", "payments"), so several
// packages keep their tables in one schema with independent version
// numbers. Other .sql names, and two files with one version, are refused
// before anything is applied; files not ending in .sql are ignored.
//
// Ambiguous failure: when a COMMIT fails (a lost connection), that file may
// or may not be applied; calling Migrate again is safe either way.
func (db *DB) Migrate(ctx context.Context, component string, migrations fs.FS) error {
	if component == "" {
		return &idem.ArgumentError{Field: "component", Reason: "must not be empty"}
	}
	if db.carried(ctx) != nil {
		// Each migration needs its own transaction.
		return &idem.ArgumentError{Field: "ctx", Reason: "must not carry a transaction: Migrate runs its own"}
	}
	list, err := sqlmigrate.List(migrations)
	if err != nil {
		return fmt.Errorf("idempg: migrate %s: %w", component, err)
	}
	if err := db.createMigrationsTable(ctx); err != nil {
		return fmt.Errorf("idempg: migrate %s: %w", component, err)
	}
	done, err := db.appliedVersions(ctx, component)
	if err != nil {
		return fmt.Errorf("idempg: migrate %s: %w", component, err)
	}
	for _, m := range list {
		if done[m.Version] {
			continue
		}
		if err := db.applyMigration(ctx, component, migrations, m); err != nil {
			return fmt.Errorf("idempg: migrate %s: %s: %w", component, m.Name, err)
		}
	}
	return nil
}

func (db *DB) createMigrationsTable(ctx context.Context) error {
	var exists bool
	if err := db.pool.QueryRow(ctx,
		pgsql.MigrationsTableExists).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	// Every component shares the table, so its creation is serialized
	// under the schema's own lock, not a component's.
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pgsql.AdvisoryLock, pgsql.LockKey(db.schema, "")); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, pgsql.CreateMigrationsTable)
		return err
	})
}

func (db *DB) appliedVersions(ctx context.Context, component string) (map[int64]bool, error) {
	rows, err := db.pool.Query(ctx, pgsql.AppliedVersions, component)
	if err != nil {
		return nil, err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	done := make(map[int64]bool, len(versions))
	for _, v := range versions {
		done[v] = true
	}
	return done, nil
}

func (db *DB) applyMigration(ctx context.Context, component string, fsys fs.FS, m migration) error {
	script, err := fs.ReadFile(fsys, m.Name)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pgsql.AdvisoryLock, pgsql.LockKey(db.schema, component)); err != nil {
			return err
		}
		// Checked under the lock: another process may have applied the
		// file while this one waited.
		var applied bool
		if err := tx.QueryRow(ctx,
			pgsql.MigrationApplied,
			component, m.Version).Scan(&applied); err != nil {
			return err
		}
		if applied {
			return nil
		}
		if strings.TrimSpace(string(script)) != "" {
			// Without arguments pgx sends the script over the simple
			// protocol, which runs several statements.
			if _, err := tx.Exec(ctx, string(script)); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx,
			pgsql.RecordMigration,
			component, m.Version, m.Name)
		return err
	})
}
