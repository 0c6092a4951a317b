package main

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// A replica dies after the card network charged a payment and before the
// payment committed. Reconciled at once, while the completer is within its
// bound, the payment is being finished: not a difference, exit 0. Past the
// bound with no completer it is an unknown outcome: a difference, exit 1.
// With the keys in Redis (--keys, given to reconcile as to serve) the same:
// the key in flight there names the payment whose charge is made, and its
// age counts from the key's claim.
func TestReconcileInFlightPayment(t *testing.T) {
	t.Parallel()
	sqlite := func(t *testing.T) []string {
		return []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
	}
	pg := func(t *testing.T) []string {
		u := postgresURL(t)
		return []string{"--db", u, "--pg-schema", freshSchema(t, u)}
	}
	inRedis := func(db func(t *testing.T) []string) func(t *testing.T) []string {
		return func(t *testing.T) []string {
			rd := redisURL(t)
			return append(db(t), "--keys", rd, "--keys-prefix", freshPrefix(t, rd))
		}
	}
	for name, db := range map[string]func(t *testing.T) []string{
		"sqlite": sqlite, "postgres": pg, "sqlite keys in redis": inRedis(sqlite), "postgres keys in redis": inRedis(pg),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reconcileInFlight(t, db(t))
		})
	}
}

func reconcileInFlight(t *testing.T, dbArgs []string) {
	hs := startCardNetwork(t)
	a := startReplica(t, "a", append(append([]string{}, dbArgs...), "--acquirer", hs.URL, "--faults", "--log-level", "warn"))
	acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("creating the account: %s", acct)
	}
	crash(t, a, "pay-in-flight", map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR"})
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the replica did not die after the charge")
	}

	before := redisKeys(t, dbArgs)
	code, out, errOut := runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key")...)
	t.Logf("reconcile at once: %s", strings.TrimSpace(out))
	if code != exitOK || !strings.Contains(out, "0 differences") || !strings.Contains(out, "being finished") || !strings.Contains(out, "1 payment(s) being finished") {
		t.Fatalf("reconcile right after the crash: exit %d, %q, %q; want the payment being finished and exit 0", code, out, errOut)
	}
	// For automation: JSON lines, the payment pending, then the summary.
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--json")...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var first, last map[string]any
	if code != exitOK || len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &first) != nil || json.Unmarshal([]byte(lines[1]), &last) != nil ||
		first["type"] != "pending" || first["amount"] != float64(1000) || last["type"] != "summary" || last["differences"] != float64(0) || last["pending"] != float64(1) {
		t.Fatalf("reconcile --json: exit %d, %q, %q; want a pending object and a summary", code, out, errOut)
	}
	// A bound already past: no completer finished it in time.
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--bound", "1ns")...)
	t.Logf("reconcile past the bound: %s", strings.TrimSpace(out))
	if code != exitFailure || !strings.Contains(out, "unknown-outcome") || strings.Contains(out, "charge-without-payment") || !strings.Contains(out, "1 difference(s)") {
		t.Fatalf("reconcile past the bound: exit %d, %q, %q; want one unknown outcome and exit 1", code, out, errOut)
	}
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--bound", "1ns", "--json")...)
	if code != exitFailure || !strings.Contains(out, `{"type":"difference","kind":"unknown-outcome"`) || !strings.Contains(out, `"differences":1`) {
		t.Fatalf("reconcile --json past the bound: exit %d, %q, %q; want the unknown outcome as a difference object", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, append(append([]string{"reconcile"}, dbArgs...), "--acquirer", hs.URL, "--bound", "0s")...); code != exitUsage || !strings.Contains(errOut, "--bound") {
		t.Fatalf("reconcile --bound 0s: exit %d, %q; want a usage error", code, errOut)
	}
	if !slices.Contains(dbArgs, "--keys") {
		return
	}
	if after := redisKeys(t, dbArgs); !maps.Equal(before, after) || len(after) == 0 {
		t.Fatalf("Redis under the prefix: %v before reconcile, %v after; want the key in flight, unchanged: reconcile only reads", before, after)
	}
	// Without --keys, the database holds no keys: reconcile says it cannot
	// see those in flight, and the charge is one without its payment.
	bare := dbArgs[:slices.Index(dbArgs, "--keys")]
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, bare...), "--acquirer", hs.URL, "--acquirer-key", "net-key", "--json")...)
	if code != exitFailure || !strings.Contains(out, `"kind":"charge-without-payment"`) || !strings.Contains(out, `"keys_seen":false`) ||
		!strings.Contains(errOut, "cannot see the keys in flight") || !strings.Contains(errOut, "--keys") {
		t.Fatalf("reconcile without --keys: exit %d, %q, %q; want the charge as a difference, and a word that the keys in flight were not seen", code, out, errOut)
	}
	// A Redis it cannot reach: nothing compared, exit 3, and no password.
	code, out, errOut = runCmd(t, append(append([]string{"reconcile"}, bare...), "--acquirer", hs.URL, "--acquirer-key", "net-key",
		"--keys", "redis://:s3cret@127.0.0.1:1/0")...)
	if code != exitUnreadable || !strings.Contains(errOut, "Redis key store") || strings.Contains(out+errOut, "s3cret") || strings.Contains(out, "DIFFERENCE") {
		t.Fatalf("reconcile with an unreachable Redis: exit %d, %q, %q; want exit %d, a clear error, no secret", code, out, errOut, exitUnreadable)
	}
}

// Reconcile only reads, on PostgreSQL too: a --pg-schema that does not
// exist is refused with an error that says so (exit 3, nothing compared),
// and is not created; one that exists without the service's tables is
// refused as not migrated, and is left without them. Before, the schema was
// created by opening the database.
func TestReconcileCreatesNothingOnPostgres(t *testing.T) {
	t.Parallel()
	u := postgresURL(t)
	hs := startCardNetwork(t)
	missing := freshSchema(t, u)
	code, out, errOut := runCmd(t, "reconcile", "--db", u, "--pg-schema", missing, "--acquirer", hs.URL, "--acquirer-key", "net-key")
	if code != exitUnreadable || !strings.Contains(errOut, "has no schema "+missing) || !strings.Contains(errOut, "creates nothing") {
		t.Errorf("reconcile of a schema that does not exist: exit %d, %q, %q; want exit %d and an error naming the missing schema", code, out, errOut, exitUnreadable)
	}
	conn, err := pgx.Connect(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, missing).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after reconcile: %d schemas named %s (%v); want none: reconcile creates nothing", n, missing, err)
	}

	bare := freshSchema(t, u)
	if _, err := conn.Exec(t.Context(), `CREATE SCHEMA `+pgx.Identifier{bare}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCmd(t, "reconcile", "--db", u, "--pg-schema", bare, "--acquirer", hs.URL, "--acquirer-key", "net-key")
	if code != exitUnreadable || !strings.Contains(errOut, "not migrated") {
		t.Errorf("reconcile of an empty schema: exit %d, %q, %q; want exit %d, not migrated", code, out, errOut, exitUnreadable)
	}
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, bare).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after reconcile: %d tables in schema %s (%v); want none", n, bare, err)
	}
}

// A service whose keys live in Redis (--keys) keeps only its payments in
// the --db database: the key store's tables are not there. Reconcile of
// that database without --keys reads it as it is: on PostgreSQL it runs
// (its pool is read-only, so creating the key store's tables would fail
// the run), and on SQLite it creates no table; and it says that it cannot
// see the keys in flight, and that --keys names where they live.
func TestReconcileOfADatabaseWithoutTheKeyStore(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		u := postgresURL(t)
		schema := freshSchema(t, u)
		db, err := idempg.Open(t.Context(), u, &idempg.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		err = payments.MigratePostgres(t.Context(), db)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		hs := startCardNetwork(t)
		code, out, errOut := runCmd(t, "reconcile", "--db", u, "--pg-schema", schema, "--acquirer", hs.URL, "--acquirer-key", "net-key")
		if code != exitOK || !strings.Contains(out, "0 differences") || !strings.Contains(errOut, "cannot see the keys in flight") {
			t.Errorf("reconcile of payments whose keys are elsewhere: exit %d, %q, %q; want exit 0, 0 differences, and a word that the keys in flight were not seen", code, out, errOut)
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "idem.db")
		db, err := idemsqlite.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := payments.Migrate(t.Context(), db); err != nil {
			t.Fatal(err)
		}
		tables := func() []string {
			rows, err := db.Reader().QueryContext(t.Context(), `SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var names []string
			for rows.Next() {
				var n string
				if err := rows.Scan(&n); err != nil {
					t.Fatal(err)
				}
				names = append(names, n)
			}
			return names
		}
		before := tables()
		hs := startCardNetwork(t)
		code, out, errOut := runCmd(t, "reconcile", "--db", "sqlite:"+path, "--acquirer", hs.URL, "--acquirer-key", "net-key")
		if code != exitOK || !strings.Contains(out, "0 differences") || !strings.Contains(errOut, "cannot see the keys in flight") {
			t.Errorf("reconcile of payments whose keys are elsewhere: exit %d, %q, %q; want exit 0, 0 differences, and a word that the keys in flight were not seen", code, out, errOut)
		}
		if after := tables(); !slices.Equal(before, after) {
			t.Errorf("reconcile changed the database's tables from %v to %v; want it to create nothing", before, after)
		}
	})
}

// redisKeys returns the DUMP of every key under the --keys-prefix of
// args, by key; nil without --keys.
func redisKeys(t *testing.T, args []string) map[string]string {
	t.Helper()
	i := slices.Index(args, "--keys")
	if i < 0 {
		return nil
	}
	opts, err := redis.ParseURL(args[i+1])
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	defer client.Close()
	prefix := args[slices.Index(args, "--keys-prefix")+1]
	out := map[string]string{}
	iter := client.Scan(t.Context(), 0, prefix+":*", 500).Iterator()
	for iter.Next(t.Context()) {
		v, err := client.Dump(t.Context(), iter.Val()).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[iter.Val()] = v
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
