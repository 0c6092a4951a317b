package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

func sqlFile(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// applied returns the versions recorded for component, in order.
func applied(t *testing.T, db *idemsqlite.DB, component string) []int64 {
	t.Helper()
	rows, err := db.Reader().QueryContext(t.Context(),
		`SELECT version FROM idem_schema_migrations WHERE component = ? ORDER BY version`, component)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var vs []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return vs
}

func tableExists(t *testing.T, db *idemsqlite.DB, name string) bool {
	t.Helper()
	var n int
	if err := db.Reader().QueryRowContext(t.Context(),
		`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestMigrateOrderAndIdempotence(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := t.Context()
	// 10 depends on 9: numeric order, not the order of the names.
	files := fstest.MapFS{
		"10_add_column.sql": sqlFile(`ALTER TABLE accounts ADD COLUMN name TEXT;`),
		"9_accounts.sql":    sqlFile(`CREATE TABLE accounts (id TEXT PRIMARY KEY); INSERT INTO accounts (id) VALUES ('a');`),
		"README.md":         sqlFile(`not a migration`),
		"0001_empty.sql":    sqlFile("-- nothing yet\n"),
	}
	if err := db.Migrate(ctx, "app", files); err != nil {
		t.Fatal(err)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1, 9, 10}) {
		t.Fatalf("applied = %v, want [1 9 10]", got)
	}
	// Running them again would fail (the table and column exist), so
	// success means nothing ran twice.
	if err := db.Migrate(ctx, "app", files); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	var rows int
	if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM accounts`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("accounts rows = %d, %v; want 1 (the insert ran once)", rows, err)
	}

	files["11_more.sql"] = sqlFile(`CREATE TABLE more (x);`)
	if err := db.Migrate(ctx, "app", files); err != nil {
		t.Fatal(err)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1, 9, 10, 11}) {
		t.Errorf("applied after adding a file = %v, want [1 9 10 11]", got)
	}
}

func TestMigrateFailureLeavesNothingApplied(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := t.Context()
	files := fstest.MapFS{
		"0001_ok.sql":   sqlFile(`CREATE TABLE ok (x);`),
		"0002_bad.sql":  sqlFile(`CREATE TABLE half (x); INSERT INTO missing_table VALUES (1);`),
		"0003_next.sql": sqlFile(`CREATE TABLE next (x);`),
	}
	err := db.Migrate(ctx, "app", files)
	if err == nil || !strings.Contains(err.Error(), "0002_bad.sql") {
		t.Fatalf("Migrate = %v, want an error naming 0002_bad.sql", err)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1}) {
		t.Errorf("applied = %v, want [1]", got)
	}
	if !tableExists(t, db, "ok") || tableExists(t, db, "half") || tableExists(t, db, "next") {
		t.Errorf("tables ok, half, next exist: %v %v %v; want true false false",
			tableExists(t, db, "ok"), tableExists(t, db, "half"), tableExists(t, db, "next"))
	}

	files["0002_bad.sql"] = sqlFile(`CREATE TABLE half (x);`)
	if err := db.Migrate(ctx, "app", files); err != nil {
		t.Fatalf("Migrate after the fix: %v", err)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("applied after the fix = %v, want [1 2 3]", got)
	}
}

func TestMigrateComponentsAreIndependent(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := t.Context()
	if err := db.Migrate(ctx, "a", fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x);`)}); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, "b", fstest.MapFS{"0001_b.sql": sqlFile(`CREATE TABLE b (x);`)}); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, db, "a") || !tableExists(t, db, "b") {
		t.Error("version 1 of one component kept version 1 of the other from running")
	}
	// The store's own schema is one more component in the same file.
	if _, err := idemsqlite.NewStore(ctx, db, nil); err != nil {
		t.Fatal(err)
	}
	if got := applied(t, db, idemsqlite.StoreComponent); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("store migrations = %v, want [1 2 3]", got)
	}
}

func TestMigrateRefusesBadInput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		component  string
		files      fstest.MapFS
		invalidArg bool
	}{
		{name: "empty component", component: "", files: fstest.MapFS{}, invalidArg: true},
		{name: "no version", component: "app", files: fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x);`), "schema.sql": sqlFile(``)}},
		{name: "no description", component: "app", files: fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x);`), "0002.sql": sqlFile(``)}},
		{name: "same version twice", component: "app", files: fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x);`), "1_b.sql": sqlFile(``)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t)
			err := db.Migrate(t.Context(), tc.component, tc.files)
			if err == nil {
				t.Fatal("Migrate succeeded")
			}
			if got := errors.Is(err, idem.ErrInvalidArgument); got != tc.invalidArg {
				t.Errorf("Migrate error %q matches ErrInvalidArgument: %v, want %v", err, got, tc.invalidArg)
			}
			if tableExists(t, db, "a") {
				t.Error("a migration ran although the set was refused")
			}
		})
	}
}

// A process that starts beside others writing to the same file (a replica
// restarted after a crash, say) finds its schema up to date: Migrate must
// not need the file's write lock then, or a start can fail with
// SQLITE_BUSY after BusyTimeout while the others keep the lock busy.
func TestMigrateOfAnUpToDateSchemaTakesNoWriteLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "idem.db")
	files := fstest.MapFS{
		"0001_accounts.sql": sqlFile(`CREATE TABLE accounts (id TEXT PRIMARY KEY);`),
		"0002_name.sql":     sqlFile(`ALTER TABLE accounts ADD COLUMN name TEXT;`),
	}
	first, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if err := first.Migrate(ctx, "app", files); err != nil {
		t.Fatal(err)
	}

	// Another process holds the write lock for as long as this test runs.
	holding := make(chan struct{})
	release := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- first.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO accounts (id) VALUES ('held')`); err != nil {
				return err
			}
			close(holding)
			<-release
			return nil
		})
	}()
	select {
	case <-holding:
	case err := <-held:
		t.Fatalf("taking the write lock: %v", err)
	}

	second, err := idemsqlite.Open(path, &idemsqlite.Config{BusyTimeout: 20 * time.Millisecond})
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	defer second.Close()
	migrateErr := second.Migrate(ctx, "app", files)
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the other process's transaction: %v", err)
	}
	if migrateErr != nil {
		t.Fatalf("Migrate of a schema already up to date, while another process holds the write lock: %v; want nil, with no write lock taken", migrateErr)
	}
	if got := applied(t, second, "app"); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("applied = %v; want [1 2]", got)
	}

	// A migration that is missing still needs the lock, and still waits for it.
	more := fstest.MapFS{"0003_more.sql": sqlFile(`CREATE TABLE more (id TEXT);`)}
	maps.Copy(more, files)
	if err := second.Migrate(ctx, "app", more); err != nil {
		t.Fatalf("Migrate with one migration missing, the lock free: %v", err)
	}
	if got := applied(t, first, "app"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("applied = %v; want [1 2 3]", got)
	}
}
