package idemsqlite_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func TestOpenMissingDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "does", "not", "exist")
	db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), nil)
	if err == nil {
		db.Close()
		t.Fatal("Open in a missing directory succeeded")
	}
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), dir) {
		t.Errorf("Open error = %q, want one naming %s and matching fs.ErrNotExist", err, dir)
	}
	if _, statErr := os.Stat(dir); !errors.Is(statErr, fs.ErrNotExist) {
		t.Errorf("Open created the directory: %v", statErr)
	}
}

func TestOpenRefusesNonFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notDir := filepath.Join(dir, "plain-file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	notDB := filepath.Join(dir, "not-a-database")
	if err := os.WriteFile(notDB, bytes.Repeat([]byte("not sqlite "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path string
		cfg        *idemsqlite.Config
		invalidArg bool
	}{
		{name: "empty", path: "", invalidArg: true},
		{name: "memory", path: ":memory:", invalidArg: true},
		{name: "URI", path: "file:x.db?mode=memory", invalidArg: true},
		{name: "negative busy timeout", path: filepath.Join(dir, "a.db"), cfg: &idemsqlite.Config{BusyTimeout: -1}, invalidArg: true},
		{name: "negative read conns", path: filepath.Join(dir, "b.db"), cfg: &idemsqlite.Config{ReadConns: -1}, invalidArg: true},
		{name: "a directory", path: dir},
		{name: "parent is a file", path: filepath.Join(notDir, "idem.db")},
		{name: "not a database", path: notDB},
	}
	for _, tc := range cases {
		db, err := idemsqlite.Open(tc.path, tc.cfg)
		if err == nil {
			db.Close()
			t.Errorf("%s: Open(%q) succeeded", tc.name, tc.path)
			continue
		}
		if got := errors.Is(err, idem.ErrInvalidArgument); got != tc.invalidArg {
			t.Errorf("%s: Open error %q matches ErrInvalidArgument: %v, want %v", tc.name, err, got, tc.invalidArg)
		}
	}
}

func TestOpenSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		cfg       *idemsqlite.Config
		busyMS    int
		readConns int
	}{
		{"defaults", nil, 5000, 4},
		{"configured", &idemsqlite.Config{BusyTimeout: 1500 * time.Millisecond, ReadConns: 2}, 1500, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "idem.db")
			db, err := idemsqlite.Open(path, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if db.Path() != path {
				t.Errorf("Path = %q, want %q", db.Path(), path)
			}
			ctx := t.Context()
			for _, p := range []struct{ name, want string }{
				{"journal_mode", "wal"},
				{"synchronous", "2"}, // FULL
				{"foreign_keys", "1"},
				{"busy_timeout", strconv.Itoa(tc.busyMS)},
			} {
				var got string
				if err := db.Writer().QueryRowContext(ctx, "PRAGMA "+p.name).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != p.want {
					t.Errorf("writer: PRAGMA %s = %s, want %s", p.name, got, p.want)
				}
			}
			for _, p := range []struct{ name, want string }{
				{"journal_mode", "wal"},
				{"foreign_keys", "1"},
				{"busy_timeout", strconv.Itoa(tc.busyMS)},
			} {
				var got string
				if err := db.Reader().QueryRowContext(ctx, "PRAGMA "+p.name).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != p.want {
					t.Errorf("reader: PRAGMA %s = %s, want %s", p.name, got, p.want)
				}
			}
			if n := db.Writer().Stats().MaxOpenConnections; n != 1 {
				t.Errorf("writer MaxOpenConnections = %d, want 1", n)
			}
			if n := db.Reader().Stats().MaxOpenConnections; n != tc.readConns {
				t.Errorf("reader MaxOpenConnections = %d, want %d", n, tc.readConns)
			}
			if _, err := db.Reader().ExecContext(ctx, `CREATE TABLE t (x)`); err == nil {
				t.Error("a reader connection wrote to the database")
			}
			if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE t (x)`); err != nil {
				t.Errorf("the writer cannot write: %v", err)
			}
		})
	}
}

func TestForeignKeysEnforced(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	ctx := t.Context()
	err := db.Migrate(ctx, "fk", fstest.MapFS{"0001_fk.sql": {Data: []byte(`
		CREATE TABLE accounts (id TEXT PRIMARY KEY);
		CREATE TABLE charges (id TEXT PRIMARY KEY, account TEXT NOT NULL REFERENCES accounts (id));`)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Writer().ExecContext(ctx, `INSERT INTO charges (id, account) VALUES ('c1', 'nobody')`); err == nil {
		t.Error("a charge referencing no account was accepted: foreign keys are off")
	}
}

// Whatever Complete acknowledged is there after the database is closed and
// opened again.
func TestDurableAcrossReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	clock := idemmem.NewClock(idemtest.Start)
	ctx := t.Context()
	req := idem.ClaimRequest{Scope: "tenant", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	resp := idem.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}

	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := idemsqlite.NewStore(ctx, db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", c.Outcome, err)
	}
	if err := s.Complete(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}, resp); err != nil {
		t.Fatal(err)
	}
	pending, err := s.Claim(ctx, idem.ClaimRequest{Scope: "tenant", Key: "pending", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err = idemsqlite.NewStore(ctx, db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatalf("NewStore on an existing database: %v", err)
	}
	dup, err := s.Claim(ctx, req)
	if err != nil || dup.Outcome != idem.Completed {
		t.Fatalf("Claim after reopening = %v, %v; want completed", dup.Outcome, err)
	}
	got := dup.Record.Response
	if got.Status != resp.Status || !bytes.Equal(got.Body, resp.Body) || got.Header.Get("Content-Type") != "application/json" {
		t.Errorf("response after reopening = %+v, want %+v", got, resp)
	}
	if r, err := s.Get(ctx, "tenant", "pending"); err != nil || r.Token != pending.Token || r.State != idem.StateInFlight {
		t.Errorf("in-flight record after reopening = %+v, %v; want token %d in flight", r, err, pending.Token)
	}
}

// The path reaches SQLite as a URI; characters that mean something in a URI
// must still name the file.
func TestOpenPathWithURICharacters(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "odd dir", "we?ird #name%20&mode=memory.db")
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemsqlite.NewStore(t.Context(), db, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() == 0 {
		t.Fatalf("the database is not at %q: %v", path, err)
	}
}
