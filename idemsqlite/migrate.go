package idemsqlite

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sqlmigrate"
)

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
	component  TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	applied_at INTEGER NOT NULL,
	PRIMARY KEY (component, version)
)`

type migration = sqlmigrate.File

// Migrate applies the migrations of component that are not applied yet.
//
// migrations holds, at its root, files named NNNN_description.sql, applied
// in the numeric order of NNNN (so 10_x.sql runs after 9_y.sql). Each file
// runs in its own transaction together with its record in the table
// idem_schema_migrations(component, version, applied_at), so a file either
// applies completely and is recorded, or leaves no trace: a failure returns
// an error naming the file, and the next Migrate retries it. Applied
// migrations are never run again, which makes Migrate safe to call on every
// start.
//
// component names whose schema this is ("idem_keys", "payments"), so several
// packages keep their own tables in one file with independent version
// numbers. Other .sql names, and two files with one version, are refused
// before anything is applied; files not ending in .sql are ignored.
func (db *DB) Migrate(ctx context.Context, component string, migrations fs.FS) error {
	if component == "" {
		return &idem.ArgumentError{Field: "component", Reason: "must not be empty"}
	}
	if db.carried(ctx) != nil {
		// Each migration needs its own transaction on the writer.
		return &idem.ArgumentError{Field: "ctx", Reason: "must not carry a transaction: Migrate runs its own"}
	}
	list, err := sqlmigrate.List(migrations)
	if err != nil {
		return fmt.Errorf("idemsqlite: migrate %s: %w", component, err)
	}
	if _, err := db.writer.ExecContext(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("idemsqlite: migrate %s: %w", component, err)
	}
	// What is applied already is read without the write lock: a process
	// that starts beside others writing to the file (a replica restarted
	// after a crash) usually finds its schema up to date, and must not wait
	// for the lock, nor fail after BusyTimeout, to learn it. A migration
	// found missing is checked again inside its write transaction.
	done, err := db.appliedVersions(ctx, component)
	if err != nil {
		return fmt.Errorf("idemsqlite: migrate %s: %w", component, err)
	}
	for _, m := range list {
		if done[m.Version] {
			continue
		}
		if err := db.applyMigration(ctx, component, migrations, m); err != nil {
			return fmt.Errorf("idemsqlite: migrate %s: %s: %w", component, m.Name, err)
		}
	}
	return nil
}

// appliedVersions reads the versions of component recorded as applied, in
// an autocommit read that takes no write lock (WAL: readers never wait).
func (db *DB) appliedVersions(ctx context.Context, component string) (map[int64]bool, error) {
	rows, err := db.writer.QueryContext(ctx,
		`SELECT version FROM idem_schema_migrations WHERE component = ?`, component)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}

func (db *DB) applyMigration(ctx context.Context, component string, fsys fs.FS, m migration) error {
	tx, err := db.writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// Checked inside the write transaction, so two processes migrating the
	// same file at once cannot both apply it.
	var applied int
	if err := tx.QueryRowContext(ctx,
		`SELECT count(*) FROM idem_schema_migrations WHERE component = ? AND version = ?`,
		component, m.Version).Scan(&applied); err != nil {
		return err
	}
	if applied > 0 {
		return nil
	}
	script, err := fs.ReadFile(fsys, m.Name)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(script)) != "" {
		if _, err := tx.ExecContext(ctx, string(script)); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO idem_schema_migrations (component, version, applied_at) VALUES (?, ?, ?)`,
		component, m.Version, time.Now().UnixNano()); err != nil {
		return err
	}
	return tx.Commit()
}
