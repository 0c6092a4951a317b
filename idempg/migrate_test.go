package idempg_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

func sqlFile(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// applied returns the versions recorded for component, in order.
func applied(t *testing.T, db *idempg.DB, component string) []int64 {
	t.Helper()
	rows, err := db.Pool().Query(t.Context(),
		`SELECT version FROM idem_schema_migrations WHERE component = $1 ORDER BY version`, component)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// tableExists reports whether the DB's schema has the table.
func tableExists(t *testing.T, db *idempg.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := db.Pool().QueryRow(t.Context(),
		`SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2)`,
		db.Schema(), name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestMigrateOrderAndIdempotence(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgURL(t), idempg.Config{})
	ctx := t.Context()
	// 10 depends on 9: numeric order, not the order of the names.
	files := fstest.MapFS{
		"10_add_column.sql": sqlFile(`ALTER TABLE accounts ADD COLUMN name text;`),
		"9_accounts.sql":    sqlFile(`CREATE TABLE accounts (id text PRIMARY KEY); INSERT INTO accounts (id) VALUES ('a');`),
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
	if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("accounts rows = %d, %v; want 1 (the insert ran once)", rows, err)
	}

	files["11_more.sql"] = sqlFile(`CREATE TABLE more (x int);`)
	if err := db.Migrate(ctx, "app", files); err != nil {
		t.Fatal(err)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1, 9, 10, 11}) {
		t.Errorf("applied after adding a file = %v, want [1 9 10 11]", got)
	}
}

func TestMigrateFailureLeavesNothingApplied(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgURL(t), idempg.Config{})
	ctx := t.Context()
	files := fstest.MapFS{
		"0001_ok.sql":   sqlFile(`CREATE TABLE ok (x int);`),
		"0002_bad.sql":  sqlFile(`CREATE TABLE half (x int); INSERT INTO missing_table VALUES (1);`),
		"0003_next.sql": sqlFile(`CREATE TABLE next (x int);`),
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

	files["0002_bad.sql"] = sqlFile(`CREATE TABLE half (x int);`)
	if err := db.Migrate(ctx, "app", files); err != nil {
		t.Fatalf("Migrate after the fix: %v", err)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("applied after the fix = %v, want [1 2 3]", got)
	}
}

func TestMigrateComponentsAreIndependent(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgURL(t), idempg.Config{})
	ctx := t.Context()
	if err := db.Migrate(ctx, "a", fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x int);`)}); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, "b", fstest.MapFS{"0001_b.sql": sqlFile(`CREATE TABLE b (x int);`)}); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, db, "a") || !tableExists(t, db, "b") {
		t.Error("version 1 of one component kept version 1 of the other from running")
	}
	// The store's own schema is one more component in the same schema.
	newStore(t, db)
	if got := applied(t, db, idempg.StoreComponent); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("store migrations = %v, want [1 2 3 4 5 6 7]", got)
	}
}

func TestMigrateRefusesBadInput(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	cases := []struct {
		name       string
		component  string
		files      fstest.MapFS
		invalidArg bool
	}{
		{name: "empty component", component: "", files: fstest.MapFS{}, invalidArg: true},
		{name: "no version", component: "app", files: fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x int);`), "schema.sql": sqlFile(``)}},
		{name: "no description", component: "app", files: fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x int);`), "0002.sql": sqlFile(``)}},
		{name: "same version twice", component: "app", files: fstest.MapFS{"0001_a.sql": sqlFile(`CREATE TABLE a (x int);`), "1_b.sql": sqlFile(``)}},
	}
	db := openDB(t, url, idempg.Config{})
	for _, tc := range cases {
		err := db.Migrate(t.Context(), tc.component, tc.files)
		if err == nil {
			t.Fatalf("%s: Migrate succeeded", tc.name)
		}
		if got := errors.Is(err, idem.ErrInvalidArgument); got != tc.invalidArg {
			t.Errorf("%s: Migrate error %q matches ErrInvalidArgument: %v, want %v", tc.name, err, got, tc.invalidArg)
		}
		if tableExists(t, db, "a") {
			t.Fatalf("%s: a migration ran although the set was refused", tc.name)
		}
	}
	err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		return db.Migrate(ctx, "app", fstest.MapFS{})
	})
	if !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Migrate inside WithTx = %v, want ErrInvalidArgument", err)
	}
}

// Replicas starting together: several processes (here: goroutines, each
// with its own pool) open one new schema and migrate it at the same moment.
// All succeed, and every migration runs exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	files := fstest.MapFS{
		// Not idempotent: a second run fails, and the insert counts runs.
		"0001_runs.sql":  sqlFile(`CREATE TABLE runs (n int); INSERT INTO runs VALUES (1);`),
		"0002_more.sql":  sqlFile(`CREATE TABLE more (x int); INSERT INTO runs VALUES (2);`),
		"0003_index.sql": sqlFile(`CREATE INDEX more_x ON more (x); INSERT INTO runs VALUES (3);`),
	}
	const replicas = 6
	dbs := make([]*idempg.DB, replicas)
	errs := make([]error, replicas)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			<-start
			ctx := t.Context()
			db, err := idempg.Open(ctx, url, &idempg.Config{Schema: schema, MaxConns: 2})
			if err != nil {
				errs[i] = err
				return
			}
			dbs[i] = db
			if err := db.Migrate(ctx, "app", files); err != nil {
				errs[i] = err
				return
			}
			s, err := idempg.NewStore(ctx, db)
			if err != nil {
				errs[i] = err
				return
			}
			s.Close()
		})
	}
	close(start)
	wg.Wait()
	for _, db := range dbs {
		if db != nil {
			t.Cleanup(func() { closeWithin(t, "the DB", db.Close) })
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	if t.Failed() {
		return
	}
	db := dbs[0]
	rows, err := db.Pool().Query(t.Context(), `SELECT n FROM runs ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(runs, []int32{1, 2, 3}) {
		t.Errorf("migration runs = %v, want [1 2 3], each once", runs)
	}
	if got := applied(t, db, "app"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("applied = %v, want [1 2 3]", got)
	}
	if got := applied(t, db, idempg.StoreComponent); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("store migrations = %v, want [1 2 3 4 5 6 7]", got)
	}
}

func TestOpenRefusesBadConfig(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", 54)
	cases := []struct {
		name string
		url  string
		cfg  *idempg.Config
	}{
		{"schema with a dot", "postgres://localhost/x", &idempg.Config{Schema: "a.b"}},
		{"schema with a quote", "postgres://localhost/x", &idempg.Config{Schema: `a"b`}},
		{"schema with a space", "postgres://localhost/x", &idempg.Config{Schema: "a b"}},
		{"schema starting with a digit", "postgres://localhost/x", &idempg.Config{Schema: "1abc"}},
		{"schema too long for the channel name", "postgres://localhost/x", &idempg.Config{Schema: long}},
		{"reserved schema", "postgres://localhost/x", &idempg.Config{Schema: "pg_idem"}},
		{"negative MaxConns", "postgres://localhost/x", &idempg.Config{MaxConns: -1}},
		{"bad URL", "postgres://user:secret@localhost:notaport/x", nil},
	}
	for _, tc := range cases {
		db, err := idempg.Open(t.Context(), tc.url, tc.cfg)
		if err == nil {
			db.Close()
			t.Errorf("%s: Open succeeded", tc.name)
			continue
		}
		if !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: Open = %v, want ErrInvalidArgument", tc.name, err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error %q shows the password", tc.name, err)
		}
	}
}

// The schema is created when missing, every connection's search_path is
// that schema alone, and a name's case is kept.
func TestOpenSchema(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, schema := range []string{randomName("idempg_test_"), randomName("IdemPg_Test_")} {
		t.Cleanup(func() { dropSchema(t, url, schema) })
		db := openDB(t, url, idempg.Config{Schema: schema})
		if db.Schema() != schema {
			t.Errorf("Schema() = %q, want %q", db.Schema(), schema)
		}
		var current string
		if err := db.Pool().QueryRow(t.Context(), `SELECT current_schema()`).Scan(&current); err != nil {
			t.Fatal(err)
		}
		if current != schema {
			t.Errorf("current_schema() = %q, want %q", current, schema)
		}
		// The store works there, wake-ups included.
		s := newStore(t, db)
		req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		c := mustClaim(t, s, req)
		waited := make(chan error, 1)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		go func() {
			// Spurious returns are allowed: wait until the key is done.
			for {
				if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
					waited <- err
					return
				}
				if r, err := s.Get(ctx, req.Scope, req.Key); err != nil || r.State == idem.StateCompleted {
					waited <- err
					return
				}
			}
		}()
		if err := s.Complete(t.Context(), refOf(c), idem.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
		if err := <-waited; err != nil {
			t.Errorf("schema %s: WaitChange: %v", schema, err)
		}
	}
}

// Unqualified names in the application's statements resolve in the DB's
// schema, so two DBs with two schemas on one database keep apart.
func TestSchemasKeepApart(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	a, b := openDB(t, url, idempg.Config{}), openDB(t, url, idempg.Config{})
	sa, sb := newStore(t, a), newStore(t, b)
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	mustClaim(t, sa, req)
	mustClaim(t, sb, req)
	for i, db := range []*idempg.DB{a, b} {
		var n int
		if err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM idem_keys`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("db %d: %d keys, want 1", i, n)
		}
	}
}
