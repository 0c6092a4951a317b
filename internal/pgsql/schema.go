package pgsql

import (
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	"github.com/idem-go/idem"
)

//go:embed keys/*.sql waiters/*.sql messages/*.sql
var migrationFiles embed.FS

// The components under which the backends record their migrations in
// idem_schema_migrations, and the migrations of each.
const (
	// KeysComponent: the table idem_keys and the functions idem_claim,
	// idem_clock_us and idem_key_lock.
	KeysComponent = "idem_keys"
	// WaitersComponent: the unlogged table idem_waiters, where waiting
	// duplicates register, and the function idem_refuse_completion.
	WaitersComponent = "idem_waiters"
	// MessagesComponent: the message tables, shared by the inbox, the
	// outbox, the dead letters and the ledger.
	MessagesComponent = "idem_messages"
)

// The migrations of each component, for a backend's Migrate: files named
// NNNN_description.sql at the root of each (see internal/sqlmigrate).
var (
	Keys     = sub("keys")
	Waiters  = sub("waiters")
	Messages = sub("messages")
)

func sub(dir string) fs.FS {
	f, err := fs.Sub(migrationFiles, dir)
	if err != nil {
		panic(err) // a directory embedded above
	}
	return f
}

// ChannelSuffix ends the name of a schema's LISTEN/NOTIFY channel, on which
// a key's change wakes its waiters: "<schema>_idem_keys".
const ChannelSuffix = "_idem_keys"

// MaxSchemaLen keeps "<schema>_idem_keys", the LISTEN/NOTIFY channel, within
// PostgreSQL's 63-byte identifier limit.
const MaxSchemaLen = 63 - len(ChannelSuffix)

var schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateSchema refuses a schema name that idem cannot use: not a plain
// identifier, too long for its channel's name, or reserved by PostgreSQL.
func ValidateSchema(s string) error {
	switch {
	case !schemaName.MatchString(s):
		return &idem.ArgumentError{Field: "Schema", Reason: fmt.Sprintf("%q is not a plain identifier (letters, digits, underscores; not starting with a digit)", s)}
	case len(s) > MaxSchemaLen:
		return &idem.ArgumentError{Field: "Schema", Reason: fmt.Sprintf("%q is longer than %d bytes", s, MaxSchemaLen)}
	case strings.HasPrefix(strings.ToLower(s), "pg_"):
		return &idem.ArgumentError{Field: "Schema", Reason: fmt.Sprintf("%q: names starting with pg_ are reserved by PostgreSQL", s)}
	}
	return nil
}

// LockKey is the advisory lock key that serializes schema changes of one
// component in one schema, across every process using the database. The
// empty component stands for the schema itself.
func LockKey(schema, component string) int64 {
	h := sha256.New()
	h.Write([]byte("idempg\x00"))
	h.Write([]byte(schema))
	h.Write([]byte{0})
	h.Write([]byte(component))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)))
}

// The statements of a migration, run by both backends the same way: the
// record table is created if missing (under LockKey(schema, "")), and
// each file runs in its own transaction with its record, under
// LockKey(schema, component), after checking under the lock that another
// process has not applied it meanwhile.
const (
	MigrationsTableExists = `SELECT to_regclass('idem_schema_migrations') IS NOT NULL`
	AppliedVersions       = `SELECT version FROM idem_schema_migrations WHERE component = $1`
	MigrationApplied      = `SELECT EXISTS (SELECT 1 FROM idem_schema_migrations WHERE component = $1 AND version = $2)`
	RecordMigration       = `INSERT INTO idem_schema_migrations (component, version, name) VALUES ($1, $2, $3)`
	AdvisoryLock          = `SELECT pg_advisory_xact_lock($1)`
)

// CreateMigrationsTable creates the table in which every component records
// the migrations applied to the schema.
const CreateMigrationsTable = `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
	component  text        NOT NULL,
	version    bigint      NOT NULL,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (component, version)
)`
