package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/idemsqlite"
)

// defaultDB is where the service keeps its data unless told otherwise: a
// file beside the working directory, so `idem serve` works with no setup.
const defaultDB = "sqlite:idem.db"

const supportedDBs = "sqlite:PATH or sqlite://PATH"

// parseDB turns a --db value into the path of a SQLite file. It never
// echoes the value back in an error: a database URL may carry a password.
func parseDB(s string) (string, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/\\. ") {
		return "", fmt.Errorf("--db needs a scheme; supported: %s (for example %s)", supportedDBs, defaultDB)
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return "", fmt.Errorf("--db sqlite: needs a file path; supported: %s", supportedDBs)
		}
		return path, nil
	case "postgres", "postgresql":
		return "", fmt.Errorf("--db: PostgreSQL is not supported yet; supported: %s", supportedDBs)
	default:
		return "", fmt.Errorf("--db: unsupported database scheme %q; supported: %s", scheme, supportedDBs)
	}
}

// dbFlag adds the --db flag to cmd.
func dbFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "db", defaultDB, "database: "+supportedDBs)
}

// openDB opens the database named by a --db value. With mustExist, a file
// that is not there is an error instead of a new, empty database: tools
// that inspect data should not create it by mistake.
func openDB(dbURL string, mustExist bool) (*idemsqlite.DB, error) {
	path, err := parseDB(dbURL)
	if err != nil {
		return nil, err
	}
	if mustExist {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("database %s does not exist (create it with 'idem migrate --db %s')", path, dbURL)
		}
	}
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		return nil, fmt.Errorf("opening database %s: %w", path, err)
	}
	return db, nil
}
