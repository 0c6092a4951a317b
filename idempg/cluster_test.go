// The Store suite on a private primary streaming to a standby
// (idemtest.StartPostgresPair), through a URL that lists both hosts with
// target_session_attrs=read-write, and the replication warnings. The
// failover under load is measured with the payment service, in
// payments/cluster_test.go.

package idempg_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// The suite through the multi-host URL: the pool connects to the primary,
// skipping the standby, whichever order the hosts are listed in. Then
// Warnings: the asynchronous standby is named; once commits wait for it,
// nothing is; and a DB on the standby alone is told it cannot write.
func TestClusterStore(t *testing.T) {
	t.Parallel()
	pair := idemtest.StartPostgresPair(t, nil)
	url := pair.URL("postgres")
	// A subtest that is not parallel returns once the suite's parallel
	// ones have: the settings below would stall the suite's commits.
	t.Run("Store", func(t *testing.T) {
		idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
			return newStore(t, openDB(t, url, idempg.Config{Clock: clock}))
		})
	})

	ctx := t.Context()
	db := openDB(t, url, idempg.Config{})
	// A reloaded setting reaches the server's processes a moment after
	// pg_reload_conf returns: each check looks again for a few seconds.
	want := func(what string, problem error) {
		t.Helper()
		var ws []*idempg.Warning
		ok := func() bool {
			var err error
			if ws, err = db.Warnings(ctx); err != nil {
				t.Fatalf("Warnings: %v", err)
			}
			if problem == nil {
				return len(ws) == 0
			}
			return len(ws) == 1 && errors.Is(ws[0], problem)
		}
		for deadline := time.Now().Add(10 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Errorf("%s: Warnings = %v, want %v", what, ws, problem)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	want("asynchronous standby", idempg.ErrAsyncStandby)
	pair.Primary.MustExec("ALTER SYSTEM SET synchronous_standby_names = '*'")
	pair.Primary.MustExec("SELECT pg_reload_conf()")
	idemtest.Eventually(t, 10*time.Second, "the standby to be synchronous", func() bool {
		out, err := pair.Primary.Query("SELECT sync_state FROM pg_stat_replication")
		return err == nil && out == "sync\n"
	})
	want("synchronous standby", nil)
	pair.Primary.MustExec("ALTER SYSTEM SET synchronous_commit = 'local'")
	pair.Primary.MustExec("SELECT pg_reload_conf()")
	want("synchronous_commit local", idempg.ErrAsyncStandby)
	pair.Primary.MustExec("ALTER SYSTEM RESET synchronous_commit")
	pair.Primary.MustExec("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
	pair.Primary.MustExec("SELECT pg_reload_conf()")
	// Commits wait for nobody from here on; the schemas' drops at the end
	// would hang.
	t.Cleanup(func() {
		pair.Primary.MustExec("ALTER SYSTEM RESET synchronous_standby_names")
		pair.Primary.MustExec("SELECT pg_reload_conf()")
	})
	want("no synchronous standby streaming", idempg.ErrNoSyncStandby)

	// Reads only: the standby refuses the schema's creation, so the DB is
	// opened on the schema the suite's first store made.
	standby, err := idempg.Open(ctx, pair.Standby.URL("postgres"), &idempg.Config{Schema: db.Schema(), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	ws, err := standby.Warnings(ctx)
	if err != nil || len(ws) != 1 || !errors.Is(ws[0], idempg.ErrStandby) {
		t.Errorf("Warnings on the standby = %v, %v; want one, ErrStandby", ws, err)
	}
}

// The machine's own PostgreSQL has no standby: no warning.
func TestClusterWarningsStandalone(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgURL(t), idempg.Config{})
	ws, err := db.Warnings(t.Context())
	if err != nil || len(ws) != 0 {
		t.Errorf("Warnings = %v, %v; want none", ws, err)
	}
}
