package idemsqlite

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
	component  TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	applied_at INTEGER NOT NULL,
	PRIMARY KEY (component, version)
)`

var migrationName = regexp.MustCompile(`^([0-9]+)_[^/]+\.sql$`)

type migration struct {
	version int64
	name    string
}

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
	list, err := listMigrations(migrations)
	if err != nil {
		return fmt.Errorf("idemsqlite: migrate %s: %w", component, err)
	}
	if _, err := db.writer.ExecContext(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("idemsqlite: migrate %s: %w", component, err)
	}
	for _, m := range list {
		if err := db.applyMigration(ctx, component, migrations, m); err != nil {
			return fmt.Errorf("idemsqlite: migrate %s: %s: %w", component, m.name, err)
		}
	}
	return nil
}

func listMigrations(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var list []migration
	seen := make(map[int64]string)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		m := migrationName.FindStringSubmatch(name)
		if m == nil {
			return nil, fmt.Errorf("%s: a migration must be named NNNN_description.sql", name)
		}
		v, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: version: %w", name, err)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("%s and %s have the same version %d", other, name, v)
		}
		seen[v] = name
		list = append(list, migration{version: v, name: name})
	}
	slices.SortFunc(list, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	return list, nil
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
		component, m.version).Scan(&applied); err != nil {
		return err
	}
	if applied > 0 {
		return nil
	}
	script, err := fs.ReadFile(fsys, m.name)
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
		component, m.version, time.Now().UnixNano()); err != nil {
		return err
	}
	return tx.Commit()
}
