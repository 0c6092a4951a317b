package main

import (
	"strings"
	"testing"
)

func TestParseDB(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		path    string
		errHas  string
		secrets string // must not appear in the error
	}{
		{in: "sqlite:idem.db", path: "idem.db"},
		{in: "sqlite://idem.db", path: "idem.db"},
		{in: "sqlite:///var/lib/idem/idem.db", path: "/var/lib/idem/idem.db"},
		{in: "sqlite:/tmp/x.db", path: "/tmp/x.db"},
		{in: "SQLite:dir/x.db", path: "dir/x.db"},
		{in: "sqlite:", errHas: "needs a file path"},
		{in: "sqlite://", errHas: "needs a file path"},
		{in: "idem.db", errHas: "needs a scheme"},
		{in: "./x:y.db", errHas: "needs a scheme"},
		{in: "", errHas: "needs a scheme"},
		{in: "postgres://u:pw1@h/db", errHas: "PostgreSQL is not supported yet", secrets: "pw1"},
		{in: "postgresql://u:pw2@h/db", errHas: "PostgreSQL is not supported yet", secrets: "pw2"},
		{in: "mysql://u:pw3@h/db", errHas: `unsupported database scheme "mysql"`, secrets: "pw3"},
	} {
		path, err := parseDB(tc.in)
		if tc.errHas == "" {
			if err != nil || path != tc.path {
				t.Errorf("parseDB(%q) = %q, %v; want %q", tc.in, path, err, tc.path)
			}
			continue
		}
		if err == nil {
			t.Errorf("parseDB(%q) = %q, nil; want an error with %q", tc.in, path, tc.errHas)
			continue
		}
		if !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), "sqlite:PATH") {
			t.Errorf("parseDB(%q) error %q; want it to contain %q and name the supported schemes", tc.in, err, tc.errHas)
		}
		if tc.secrets != "" && strings.Contains(err.Error(), tc.secrets) {
			t.Errorf("parseDB(%q) error %q leaks %q", tc.in, err, tc.secrets)
		}
	}
}

func TestUsageMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"unknown flag: --x", "unknown flag: --x"},
		{"unknown command \"serv\" for \"idem\"\n\nDid you mean this?\n\tserve\n", `unknown command "serv" for "idem" (did you mean "serve"?)`},
		{"unknown command \"ke\" for \"idem\"\n\nDid you mean this?\n\tkeys\n\tdemo\n", `unknown command "ke" for "idem" (did you mean "keys" or "demo"?)`},
		{"two\nlines", "two lines"},
	} {
		if got := usageMessage(errString(tc.in)); got != tc.want {
			t.Errorf("usageMessage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
