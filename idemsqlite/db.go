package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Config configures Open. The zero value is ready to use.
type Config struct {
	// BusyTimeout is how long a connection waits for a lock that another
	// connection holds (another process writing the file, or a checkpoint)
	// before failing with SQLITE_BUSY. Within one DB writers never wait on
	// it: they queue for the single writer connection instead. Defaults
	// to 5s.
	BusyTimeout time.Duration
	// ReadConns is the number of read-only connections, which serve Get and
	// the caller's reads without waiting for the writer. Defaults to 4.
	ReadConns int
	// GroupCommit is how long synced write transactions that queue for
	// the writer one behind the other may keep sharing one transaction,
	// each in a savepoint, so that one commit (one fsync) serves them all:
	// a group commits as soon as nobody synced waits behind it, or when it
	// has been open this long. Each transaction's WithTx (or CompleteTx,
	// ClaimTx) returns once its group has committed. See the package
	// documentation, "Group commit", for what a transaction shares with its
	// group. Defaults to 2ms; negative commits every transaction alone.
	GroupCommit time.Duration
}

// defaultGroupCommit is Config.GroupCommit's default.
const defaultGroupCommit = 2 * time.Millisecond

// DB is one SQLite database file opened for idem: a single writer
// connection, on which every write transaction runs in turn, and a pool of
// read-only connections. It is safe for concurrent use.
type DB struct {
	path   string
	writer *sql.DB
	reader *sql.DB
	stmts  stmtCache
	queue  writerQueue // the order in which the package's transactions get the writer
	// testHookRelax, when not nil, is called as an unsynced transaction
	// sets synchronous=NORMAL on the writer: tests end a context there.
	testHookRelax func()
}

// Open opens (creating it if needed) the database file at path, in WAL mode
// with synchronous=FULL, foreign keys enforced and the configured busy
// timeout on every connection. The directory holding path must exist: Open
// does not create directories, so a mistyped path fails here instead of
// scattering databases. cfg may be nil.
func Open(path string, cfg *Config) (*DB, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = 5 * time.Second
	}
	if c.ReadConns == 0 {
		c.ReadConns = 4
	}
	if c.GroupCommit == 0 {
		c.GroupCommit = defaultGroupCommit
	}
	switch {
	case c.BusyTimeout < 0:
		return nil, &idem.ArgumentError{Field: "BusyTimeout", Reason: "must not be negative"}
	case c.ReadConns < 0:
		return nil, &idem.ArgumentError{Field: "ReadConns", Reason: "must not be negative"}
	case path == "" || path == ":memory:" || strings.HasPrefix(path, "file:"):
		// Two pools need one file they both open; a memory database or a
		// URI with its own parameters would defeat that.
		return nil, &idem.ArgumentError{Field: "path", Reason: fmt.Sprintf("%q is not a file path", path)}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	dir := filepath.Dir(abs)
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: the directory %s must exist: %w", path, dir, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("idemsqlite: open %s: %s is not a directory", path, dir)
	}
	if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("idemsqlite: open %s: it is a directory", path)
	}

	busy := strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10)
	writer, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {
			"busy_timeout(" + busy + ")",
			"journal_mode(WAL)",
			"synchronous(FULL)",
			"foreign_keys(ON)",
		},
		// BEGIN IMMEDIATE takes the write lock when the transaction starts,
		// so a transaction that reads and then writes (Claim) never fails
		// to upgrade its lock against another process.
		"_txlock": {"immediate"},
	}))
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	// One connection: writers queue fairly in database/sql instead of
	// spinning on SQLITE_BUSY, and a transaction on it has the file's write
	// lock to itself. Kept open forever so it is never re-dialled mid-run.
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)
	// Connecting runs the pragmas, so the file is in WAL mode before any
	// reader opens it, and a file that is not a database fails here.
	if err := checkWAL(writer); err != nil {
		writer.Close()
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}

	reader, err := sql.Open("sqlite", dsn(abs, url.Values{
		"mode": {"ro"},
		"_pragma": {
			"busy_timeout(" + busy + ")",
			"foreign_keys(ON)",
		},
	}))
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("idemsqlite: open %s: %w", path, err)
	}
	reader.SetMaxOpenConns(c.ReadConns)
	reader.SetMaxIdleConns(c.ReadConns)
	if err := reader.Ping(); err != nil {
		reader.Close()
		writer.Close()
		return nil, fmt.Errorf("idemsqlite: open %s for reading: %w", path, err)
	}
	db := &DB{path: abs, writer: writer, reader: reader, queue: writerQueue{window: c.GroupCommit}}
	db.queue.db = db
	return db, nil
}

// dsn returns a SQLite URI for the file at the absolute path abs. The URI
// form makes SQLite honour mode=ro; the driver reads the underscore keys.
func dsn(abs string, params url.Values) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: params.Encode()}
	return u.String()
}

func checkWAL(writer *sql.DB) error {
	var mode string
	if err := writer.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, not WAL (is the file on a file system without shared memory?)", mode)
	}
	return nil
}

// Close closes both pools, and the statements the package prepared on
// them. Transactions still open are rolled back.
func (db *DB) Close() error {
	db.stmts.close()
	return errors.Join(db.reader.Close(), db.writer.Close())
}

// ErrPrepareInTx is returned by Prepare when its context carries a
// transaction of the same DB.
var ErrPrepareInTx = errors.New("idemsqlite: Prepare called with a context that carries a transaction of the same database (prepare before the transaction, once)")

// Prepare prepares query on the writer connection, for a statement that
// the application runs in its WithTx transactions again and again:
// tx.StmtContext(ctx, stmt) binds it to a transaction of the DB without
// parsing the text again. Every write holds the single writer, so the
// parse of a statement run as text delays every other write, and SQLite
// often spends longer parsing and planning a short statement than running
// it.
//
// Prepare once, before serving (a constructor is the place), never inside
// a transaction of the DB: the transaction holds the writer's only
// connection, so Prepare returns ErrPrepareInTx rather than wait for it
// forever. The statement lives until it is closed or the DB is.
func (db *DB) Prepare(ctx context.Context, query string) (*sql.Stmt, error) {
	if db.carried(ctx) != nil {
		return nil, ErrPrepareInTx
	}
	stmt, err := db.writer.PrepareContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: prepare %q: %w", abbreviate(query), err)
	}
	return stmt, nil
}

// Writer returns the pool of the single writer connection. Writes made
// through it outside WithTx run in their own implicit transactions.
//
// Never use it inside WithTx's fn or CompleteTx's work once the transaction
// has begun: the transaction holds the only connection, so the call waits for
// itself forever. Use the *sql.Tx that WithTx passes instead.
func (db *DB) Writer() *sql.DB { return db.writer }

// Reader returns the pool of read-only connections. Reads through it do not
// wait for the writer, and see only committed data.
func (db *DB) Reader() *sql.DB { return db.reader }

// Path returns the absolute path of the database file.
func (db *DB) Path() string { return db.path }
