package main

import (
	"strings"
	"testing"
)

func TestParseDB(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in       string
		path     string
		postgres bool
		shown    string
		errHas   string
		secrets  string // must appear neither in the error nor in shown
	}{
		{in: "sqlite:idem.db", path: "idem.db", shown: "idem.db"},
		{in: "sqlite://idem.db", path: "idem.db", shown: "idem.db"},
		{in: "sqlite:///var/lib/idem/idem.db", path: "/var/lib/idem/idem.db", shown: "/var/lib/idem/idem.db"},
		{in: "sqlite:/tmp/x.db", path: "/tmp/x.db", shown: "/tmp/x.db"},
		{in: "SQLite:dir/x.db", path: "dir/x.db", shown: "dir/x.db"},
		{in: "postgres://u:pw1@h/db", postgres: true, shown: "postgres://u:xxxxx@h/db", secrets: "pw1"},
		{in: "postgresql://u:pw2@h:5433/db?sslmode=disable", postgres: true, shown: "postgresql://u:xxxxx@h:5433/db?sslmode=disable", secrets: "pw2"},
		{in: "postgres://postgres@127.0.0.1/test", postgres: true, shown: "postgres://postgres@127.0.0.1/test"},
		{in: "sqlite:", errHas: "needs a file path"},
		{in: "sqlite://", errHas: "needs a file path"},
		{in: "idem.db", errHas: "needs a scheme"},
		{in: "./x:y.db", errHas: "needs a scheme"},
		{in: "", errHas: "needs a scheme"},
		{in: "postgres://u:pw%zz3@h/db", errHas: "does not parse", secrets: "pw%zz3"},
		{in: "mysql://u:pw4@h/db", errHas: `unsupported database scheme "mysql"`, secrets: "pw4"},
	} {
		got, err := parseDB(tc.in)
		if tc.errHas == "" {
			if err != nil || got.postgres != tc.postgres || got.path != tc.path || got.shown != tc.shown {
				t.Errorf("parseDB(%q) = %+v, %v; want postgres=%v path %q shown %q", tc.in, got, err, tc.postgres, tc.path, tc.shown)
			}
			if tc.postgres && got.url != tc.in {
				t.Errorf("parseDB(%q).url = %q, want the URL unchanged", tc.in, got.url)
			}
		} else if err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("parseDB(%q) error %v; want it to contain %q", tc.in, err, tc.errHas)
		}
		if err != nil && strings.Contains(tc.errHas, "scheme") && (!strings.Contains(err.Error(), "sqlite:PATH") || !strings.Contains(err.Error(), "postgres://")) {
			t.Errorf("parseDB(%q) error %q does not name the supported schemes", tc.in, err)
		}
		if tc.secrets != "" && (strings.Contains(got.shown, tc.secrets) || err != nil && strings.Contains(err.Error(), tc.secrets)) {
			t.Errorf("parseDB(%q) leaks %q: shown %q, error %v", tc.in, tc.secrets, got.shown, err)
		}
	}
}

func TestParseKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, shown, errHas, secret string
	}{
		{in: "redis://127.0.0.1:6379/0", shown: "redis://127.0.0.1:6379/0"},
		{in: "rediss://:pw1@cache.example:6380/2", shown: "rediss://:xxxxx@cache.example:6380/2", secret: "pw1"},
		{in: "REDIS://h/0", shown: "redis://h/0"},
		{in: "127.0.0.1:6379", errHas: "needs a URL"},
		{in: "memcached://u:pw2@h", errHas: `unsupported key store scheme "memcached"`, secret: "pw2"},
		{in: "redis://:pw%zz3@h/0", errHas: "does not parse", secret: "pw%zz3"},
	} {
		got, err := parseKeys(tc.in)
		if tc.errHas == "" {
			if err != nil || got.shown != tc.shown || got.url != tc.in {
				t.Errorf("parseKeys(%q) = %+v, %v; want shown %q", tc.in, got, err, tc.shown)
			}
		} else if err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("parseKeys(%q) error %v; want it to contain %q", tc.in, err, tc.errHas)
		}
		if tc.secret != "" && (strings.Contains(got.shown, tc.secret) || err != nil && strings.Contains(err.Error(), tc.secret)) {
			t.Errorf("parseKeys(%q) leaks %q: shown %q, error %v", tc.in, tc.secret, got.shown, err)
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
