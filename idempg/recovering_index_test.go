package idempg_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/pgsql"
)

// Abandoned and InFlightAtPoints, which a Completer's every round and an
// audit run, read through the partial index idem_keys_recovering
// (migration 0004), which holds only the keys in flight with a point, and
// not through a scan of every key: among 60,000 keys as a busy service
// has them (most completed, a third of those keeping the point their
// execution reached, some in flight without one), where 100 are in flight
// at a point, the planner's own choice, its settings left as they are,
// names the index, both for the plan made for the call's values and for
// the generic plan a prepared statement comes to after five executions.
func TestAtPointsListingsUseTheirPartialIndex(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{})
	newStore(t, db) // migrates
	ctx := t.Context()
	_, err := db.Pool().Exec(ctx, `
		INSERT INTO idem_keys (scope, key, fingerprint, state, token, status, header, body,
			created_at, lease_expires_at, expires_at, completed_at,
			recovery_point, recovery_data, recovery_saved_at)
		SELECT 'merchant-' || (i % 97), 'order-' || i, md5(i::text), 'completed', i, 201, '{}', '\x7b7d',
			now() - interval '1 hour', now() - interval '59 minutes', now() + interval '23 hours', now() - interval '59 minutes',
			CASE WHEN i % 3 = 0 THEN 'charged' END, CASE WHEN i % 3 = 0 THEN '\x7b7d'::bytea END,
			CASE WHEN i % 3 = 0 THEN now() - interval '59 minutes' END
		FROM generate_series(1, 58000) i;
		INSERT INTO idem_keys (scope, key, fingerprint, state, token,
			created_at, lease_expires_at, expires_at)
		SELECT 'merchant-' || (i % 97), 'busy-' || i, md5(i::text), 'in_flight', i,
			now(), now() + interval '30 seconds', now() + interval '24 hours'
		FROM generate_series(1, 1900) i;
		INSERT INTO idem_keys (scope, key, fingerprint, state, token,
			created_at, lease_expires_at, expires_at, recovery_point, recovery_data, recovery_saved_at)
		SELECT 'merchant-' || (i % 97), 'stopped-' || i, md5(i::text), 'in_flight', i,
			now() - interval '1 minute', now() + (i - 50) * interval '1 second', now() + interval '24 hours',
			'charging', '\x7b7d', now() - interval '1 minute'
		FROM generate_series(1, 100) i;
		ANALYZE idem_keys`)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, q := range []struct {
		name  string
		query string
		args  []any  // the call's values, for its custom plan
		exec  string // the same as EXECUTE's arguments, for the generic plan
	}{
		{"Abandoned", pgsql.Abandoned, []any{time.Now(), 100}, "now(), 100"},
		{"Abandoned, by the database's clock", pgsql.Abandoned, []any{nil, 100}, "NULL, 100"},
		{"InFlightAtPoints", pgsql.InFlightAtPoints, []any{100}, "100"},
	} {
		// The plan made for the call's values: EXPLAIN with its parameters
		// bound plans the query for them, whatever plan_cache_mode says.
		var plan []byte
		if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q.query, q.args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", q.name, err)
		}
		if !planUses(t, plan, "idem_keys_recovering") {
			t.Errorf("%s, the plan for its values: names no index idem_keys_recovering: %s", q.name, plan)
		}
		// The generic plan: only EXPLAIN EXECUTE of a prepared statement
		// goes through the plan cache, which force_generic_plan sends to
		// it at once (PostgreSQL 15 has no EXPLAIN (GENERIC_PLAN)).
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "PREPARE atpoints AS "+q.query); err != nil {
			t.Fatalf("%s: PREPARE: %v", q.name, err)
		}
		if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE atpoints("+q.exec+")").Scan(&plan); err != nil {
			t.Fatalf("%s: EXPLAIN EXECUTE: %v", q.name, err)
		}
		if _, err := conn.Exec(ctx, "DEALLOCATE atpoints; RESET plan_cache_mode"); err != nil {
			t.Fatal(err)
		}
		if !planUses(t, plan, "idem_keys_recovering") {
			t.Errorf("%s, its generic plan: names no index idem_keys_recovering: %s", q.name, plan)
		}
	}
}

// planUses reports whether an EXPLAIN (FORMAT JSON) plan scans index.
func planUses(t *testing.T, plan []byte, index string) bool {
	t.Helper()
	var nodes []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &nodes); err != nil {
		t.Fatalf("%v in %s", err, plan)
	}
	return len(nodes) == 1 && nodes[0].Plan.uses(index)
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan, with what the test
// reads of it.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

// uses reports whether the plan under n scans index.
func (n planNode) uses(index string) bool {
	if n.IndexName == index {
		return true
	}
	for _, c := range n.Plans {
		if c.uses(index) {
			return true
		}
	}
	return false
}
