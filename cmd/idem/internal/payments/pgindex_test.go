package payments

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

// The PostgreSQL migration that adds payments_charged_created runs, as
// every migration does, in a transaction (idempg.DB.Migrate), where
// CREATE INDEX CONCURRENTLY cannot: on a large payments table its plain
// CREATE INDEX holds the table's writes while the index is built. An
// operator builds the index CONCURRENTLY beforehand, and the migration
// then finds it and takes no lock.
func TestChargedPaymentsIndexBuiltConcurrentlyBeforehand(t *testing.T) {
	t.Parallel()
	db := OpenPostgresForTest(t, nil)
	ctx := t.Context()
	// The schema as it was before the index's migration.
	before := fstest.MapFS{}
	err := fs.WalkDir(pgMigrationFiles, "pgmigrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := strings.TrimPrefix(path, "pgmigrations/")
		if name >= "0009" {
			return nil
		}
		data, err := fs.ReadFile(pgMigrationFiles, path)
		before[name] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, migrationComponent, before); err != nil {
		t.Fatal(err)
	}
	// Outside any transaction, as an operator runs it on a live table.
	if _, err := db.Pool().Exec(ctx, `CREATE INDEX CONCURRENTLY payments_charged_created ON payments (created_at, id) WHERE charge_id IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if err := migratePostgres(ctx, db); err != nil {
		t.Fatalf("migrating a schema whose index was built concurrently beforehand: %v", err)
	}
	var n int
	if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = 'payments_charged_created'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d indexes payments_charged_created (%v); want the one built beforehand", n, err)
	}
}
