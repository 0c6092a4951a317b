// Package sqlmigrate reads the migration files the SQL backends embed.
// Applying them is each backend's own business (locks, transactions and the
// record table differ); naming and ordering them is shared, so that every
// backend accepts and refuses the same files.
package sqlmigrate

import (
	"cmp"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var fileName = regexp.MustCompile(`^([0-9]+)_[^/]+\.sql$`)

// File is one migration: NNNN_description.sql at the root of its FS.
type File struct {
	Version int64
	Name    string
}

// List returns the migrations at the root of fsys in the numeric order of
// their versions (so 10_x.sql comes after 9_y.sql). Files not ending in
// .sql are ignored; other .sql names, and two files with one version, are
// refused, so nothing is applied from a malformed set.
func List(fsys fs.FS) ([]File, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var list []File
	seen := make(map[int64]string)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		m := fileName.FindStringSubmatch(name)
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
		list = append(list, File{Version: v, Name: name})
	}
	slices.SortFunc(list, func(a, b File) int { return cmp.Compare(a.Version, b.Version) })
	return list, nil
}
