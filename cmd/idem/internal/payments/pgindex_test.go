package payments

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idem-go/idem/idempg"
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
	migrateBeforeChargedIndex(t, db)
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

// A CREATE INDEX CONCURRENTLY that fails (cancelled, timed out) leaves an
// INVALID index, which the planner never uses and CREATE INDEX IF NOT
// EXISTS takes for the index: the migration must build it again, or idem
// reconcile pages through the payments without it for good.
func TestChargedPaymentsIndexLeftInvalidIsBuiltAgain(t *testing.T) {
	t.Parallel()
	db := OpenPostgresForTest(t, nil)
	ctx := t.Context()
	migrateBeforeChargedIndex(t, db)
	// A transaction that writes payments keeps the concurrent build
	// waiting, and the build's lock_timeout ends it, its index left
	// INVALID.
	writer, err := db.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	if _, err := writer.Exec(ctx, `LOCK TABLE payments IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	builder, err := db.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Exec(ctx, `SET lock_timeout = '50ms'`); err != nil {
		t.Fatal(err)
	}
	_, err = builder.Exec(ctx, `CREATE INDEX CONCURRENTLY payments_charged_created ON payments (created_at, id) WHERE charge_id IS NOT NULL`)
	builder.Exec(ctx, `RESET lock_timeout`)
	builder.Release()
	if err == nil {
		t.Fatal("the concurrent build did not fail; this test needs it to")
	}
	if err := writer.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	valid := func() (n int, ok bool) {
		t.Helper()
		if err := db.Pool().QueryRow(ctx, `SELECT count(*), coalesce(bool_and(i.indisvalid), false) FROM pg_index i
			JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace s ON s.oid = c.relnamespace
			WHERE s.nspname = current_schema() AND c.relname = 'payments_charged_created'`).Scan(&n, &ok); err != nil {
			t.Fatal(err)
		}
		return n, ok
	}
	if n, ok := valid(); n != 1 || ok {
		t.Fatalf("%d indexes payments_charged_created, valid %t, after the failed build; want one INVALID", n, ok)
	}
	if err := migratePostgres(ctx, db); err != nil {
		t.Fatalf("migrating a schema whose concurrent build of the index failed: %v", err)
	}
	if n, ok := valid(); n != 1 || !ok {
		t.Fatalf("%d indexes payments_charged_created, valid %t, after the migration; want one, valid", n, ok)
	}
}

// migrateBeforeChargedIndex migrates db's schema as it was before the
// migration that adds payments_charged_created.
func migrateBeforeChargedIndex(t *testing.T, db *idempg.DB) {
	t.Helper()
	ctx := t.Context()
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
}
