package main

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemsqlite"
)

func TestAcquirerBadFlagsCreateNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fault-rate", "0.5"}, "--fault-rate needs --faults"},
		{[]string{"--faults", "--fault-rate", "2"}, "--fault-rate 2: want a share from 0 to 1"},
		{[]string{"--key-ttl", "0s"}, "--key-ttl must be positive"},
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"--addr", "0.0.0.0:0"}, "refuses to listen beyond loopback without an API key"},
		{[]string{"--addr", ":0"}, "refuses to listen beyond loopback without an API key"},
		{[]string{"--addr", "[::]:0"}, "refuses to listen beyond loopback without an API key"},
		{[]string{"--addr", "192.0.2.1:0"}, "refuses to listen beyond loopback without an API key"},
	} {
		path := filepath.Join(t.TempDir(), "acquirer.db")
		code, _, stderr := runCmd(t, append([]string{"acquirer", "--addr", "127.0.0.1:0", "--db", "sqlite:" + path}, tc.args...)...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("acquirer %v: exit %d, %q; want a failure saying %q", tc.args, code, stderr, tc.want)
		}
		if _, err := os.Stat(path); err == nil {
			t.Errorf("acquirer %v created %s", tc.args, path)
		}
	}
	if code, _, stderr := runCmd(t, "acquirer", "--db", "postgres://x/y"); code == 0 || !strings.Contains(stderr, "SQLite file") {
		t.Errorf("acquirer on PostgreSQL: exit %d, %q", code, stderr)
	}
}

// serve --acquirer charges at the network, and reconcile finds the books
// in agreement.
func TestServeWithAcquirerReconciles(t *testing.T) {
	t.Parallel()
	hs := startCardNetwork(t)

	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	const apiKey = "test-key-1"
	env := map[string]string{envAcquirerKey: "net-key"}
	srv := startServe(t, newApp(env), "--db", dbURL, "--api-keys", "acme:"+apiKey, "--log-level", "warn", "--acquirer", hs.URL)
	checkChargesOnce(t, srv, apiKey)
	stopCleanly(t, srv)

	code, stdout, stderr := runCmd(t, "reconcile", "--db", dbURL, "--acquirer", hs.URL, "--acquirer-key", "net-key")
	if code != 0 || !strings.Contains(stdout, "1 payments") || !strings.Contains(stdout, "1 charges") || !strings.Contains(stdout, "0 differences") {
		t.Fatalf("reconcile: exit %d, %q, %q; want the one payment and its charge in agreement", code, stdout, stderr)
	}
	if code, _, stderr := runCmd(t, "reconcile", "--db", dbURL); code != exitUsage || !strings.Contains(stderr, "--acquirer is required") {
		t.Errorf("reconcile without --acquirer: exit %d, %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "reconcile", "--db", dbURL, "--acquirer", hs.URL, "--since", "yesterday"); code != exitUsage || !strings.Contains(stderr, "--since") {
		t.Errorf("reconcile --since yesterday: exit %d, %q", code, stderr)
	}
	// A read-only audit: a database without the service's schema is
	// refused, and left as it was.
	bare := filepath.Join(t.TempDir(), "bare.db")
	bdb, err := idemsqlite.Open(bare, nil)
	if err != nil {
		t.Fatal(err)
	}
	bdb.Close()
	if code, _, stderr := runCmd(t, "reconcile", "--db", "sqlite:"+bare, "--acquirer", hs.URL, "--acquirer-key", "net-key"); code == 0 || !strings.Contains(stderr, "not migrated") {
		t.Errorf("reconcile of a database never migrated: exit %d, %q; want it refused", code, stderr)
	}
	bdb, err = idemsqlite.Open(bare, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	var tables int
	if err := bdb.Reader().QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table'`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("reconcile left %d tables (%v) in a database it only reads", tables, err)
	}
}

// startCardNetwork runs a card network in the test, its API key net-key.
func startCardNetwork(t *testing.T) *httptest.Server {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	net, err := acquirer.New(t.Context(), acquirer.Config{DB: db, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(net.Handler())
	t.Cleanup(hs.Close)
	return hs
}
