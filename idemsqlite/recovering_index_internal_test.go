package idemsqlite

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Abandoned and InFlightAtPoints, which a Completer's every round and an
// audit run, read through the partial index idem_keys_recovering
// (migration 0002), which holds only the keys in flight with a point, and
// not through a scan of every key: among 60,000 keys as a busy service
// has them (most completed, a third of those keeping the point their
// execution reached, some in flight without one), where 100 are in flight
// at a point, SQLite's plan for the call's values names the index, both
// as the package leaves the file (no statistics) and once ANALYZE has run
// (as PRAGMA optimize, or an operator, runs it; this build keeps STAT4
// samples, with which a range is planned for the values bound).
func TestAtPointsListingsUseTheirPartialIndex(t *testing.T) {
	t.Parallel()
	db, err := Open(filepath.Join(t.TempDir(), "recovering.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := NewStore(t.Context(), db, nil); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0).UnixNano()
	const (
		sec  = int64(time.Second)
		hour = int64(time.Hour)
	)
	_, err = db.Writer().ExecContext(t.Context(), `
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 58000)
		INSERT INTO idem_keys (scope, key, fingerprint, state, token, status, header, body,
			created_at, lease_expires_at, expires_at, completed_at,
			recovery_point, recovery_data, recovery_saved_at)
		SELECT 'merchant-' || (i % 97), 'order-' || i, 'fp-' || i, 'completed', i, 201, '{}', x'7b7d',
			?1 - ?3, ?1 - ?3 + 60 * ?2, ?1 + 23 * ?3, ?1 - ?3 + 60 * ?2,
			CASE WHEN i % 3 = 0 THEN 'charged' END, CASE WHEN i % 3 = 0 THEN x'7b7d' END,
			CASE WHEN i % 3 = 0 THEN ?1 - ?3 + 60 * ?2 END
		FROM n;
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1900)
		INSERT INTO idem_keys (scope, key, fingerprint, state, token,
			created_at, lease_expires_at, expires_at)
		SELECT 'merchant-' || (i % 97), 'busy-' || i, 'fp-' || i, 'in_flight', i,
			?1, ?1 + 30 * ?2, ?1 + 24 * ?3
		FROM n;
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
		INSERT INTO idem_keys (scope, key, fingerprint, state, token,
			created_at, lease_expires_at, expires_at, recovery_point, recovery_data, recovery_saved_at)
		SELECT 'merchant-' || (i % 97), 'stopped-' || i, 'fp-' || i, 'in_flight', i,
			?1 - 60 * ?2, ?1 + (i - 50) * ?2, ?1 + 24 * ?3, 'charging', x'7b7d', ?1 - 60 * ?2
		FROM n`, now, sec, hour)
	if err != nil {
		t.Fatal(err)
	}
	listings := []struct {
		name string
		s    *statement
		args []any
	}{
		{"Abandoned", sqlAbandonedKeys, []any{now, 100}},
		{"InFlightAtPoints", sqlInFlightAtPoints, []any{100}},
	}
	for _, stats := range []string{"without statistics", "after ANALYZE"} {
		if stats == "after ANALYZE" {
			if _, err := db.Writer().ExecContext(t.Context(), `ANALYZE`); err != nil {
				t.Fatal(err)
			}
		}
		for _, l := range listings {
			// On the writer, which ran ANALYZE and so plans with its
			// statistics; a reader plans as it does once it reads them.
			rows, err := db.Writer().QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+l.s.sql, l.args...)
			if err != nil {
				t.Fatalf("%s: %v", l.name, err)
			}
			var plan []string
			for rows.Next() {
				var id, parent, notUsed int
				var detail string
				if err := rows.Scan(&id, &parent, &notUsed, &detail); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, detail)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			uses := false
			for _, d := range plan {
				if strings.Contains(d, "USING INDEX idem_keys_recovering") {
					uses = true
				}
			}
			if !uses {
				t.Errorf("%s, %s: its plan names no index idem_keys_recovering: %q", l.name, stats, plan)
			}
		}
	}
}
