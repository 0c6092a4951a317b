package idempg

import (
	"errors"
	"testing"

	"github.com/idem-go/idem/internal/pgsql"
	"github.com/jackc/pgx/v5"
)

// The INSERT that claims a new key turns synchronous_commit off for its own
// transaction when asked to (a claim on its own), and leaves it alone
// otherwise (a claim that joins the caller's transaction).
func TestInsertClaimCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	db := openTraced(t, nil)
	ctx := t.Context()
	s, err := NewStore(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var serverDefault string
	if err := db.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&serverDefault); err != nil {
		t.Fatal(err)
	}
	if serverDefault == "off" {
		t.Skip("the server runs with synchronous_commit=off already")
	}
	errUndo := errors.New("undo")
	for _, async := range []bool{true, false} {
		err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
			var token int64
			var a, b, c any
			if err := tx.QueryRow(ctx, pgsql.InsertClaim, "s", "k", "fp", int64(1000000), int64(3600000000), nil, async, nil, nil).
				Scan(&token, &a, &b, &c); err != nil {
				return err
			}
			var setting string
			if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil {
				return err
			}
			if want := map[bool]string{true: "off", false: serverDefault}[async]; setting != want {
				t.Errorf("async=%v: synchronous_commit %q after the claim, want %q", async, setting, want)
			}
			return errUndo
		})
		if !errors.Is(err, errUndo) {
			t.Fatalf("async=%v: %v", async, err)
		}
	}
}
