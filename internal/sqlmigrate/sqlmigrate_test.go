package sqlmigrate

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestList(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"10_later.sql":  {Data: []byte("x")},
		"9_earlier.sql": {Data: []byte("x")},
		"README.md":     {Data: []byte("ignored")},
		"sub/1_x.sql":   {Data: []byte("ignored: not at the root")},
	}
	list, err := List(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0] != (File{9, "9_earlier.sql"}) || list[1] != (File{10, "10_later.sql"}) {
		t.Fatalf("List = %+v", list)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"must be named":    {"create.sql": {}},
		"the same version": {"1_a.sql": {}, "01_b.sql": {}},
		"version":          {"99999999999999999999_big.sql": {}},
	} {
		if _, err := List(fsys); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: List error = %v", name, err)
		}
	}
}
