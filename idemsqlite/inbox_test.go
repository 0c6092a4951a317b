package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// openMessagesDB opens a fresh database file for one test.
func openMessagesDB(t *testing.T) *idemsqlite.DB {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// effects is the suite's view of a consumer's own table, written through
// WithTx so that inside Process it joins the inbox's transaction.
type effects struct{ db *idemsqlite.DB }

func newEffects(t *testing.T, db *idemsqlite.DB) effects {
	t.Helper()
	err := db.Migrate(t.Context(), "test_effects", fstest.MapFS{
		"0001_effects.sql": {Data: []byte(`CREATE TABLE effects (tag TEXT NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return effects{db}
}

var errNoTx = errors.New("the context carries no transaction")

func (e effects) Write(ctx context.Context, tag string) error {
	// A write outside the inbox's transaction would commit on its own:
	// refuse it, as the suite asks.
	if !carriesTx(ctx, e.db) {
		return errNoTx
	}
	return e.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (tag) VALUES (?)`, tag)
		return err
	})
}

// carriesTx reports whether ctx carries a transaction of db, which WithTx
// then joins.
func carriesTx(ctx context.Context, db *idemsqlite.DB) bool { return idemsqlite.CarriesTx(ctx, db) }

func (e effects) Count(ctx context.Context, tag string) (int, error) {
	var n int
	err := e.db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE tag = ?`, tag).Scan(&n)
	return n, err
}

func TestInboxJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	in, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	fx := newEffects(t, db)
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error { return fx.Write(ctx, "e") }); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if n, _ := fx.Count(ctx, "e"); n != 0 {
		t.Errorf("%d effects after the caller rolled back, want 0", n)
	}
	// The record rolled back with the caller's transaction.
	if err := in.Process(ctx, "c", "m-1", func(ctx context.Context) error { return fx.Write(ctx, "e") }); err != nil {
		t.Fatalf("Process after the rollback = %v, want nil", err)
	}
	if n, _ := fx.Count(ctx, "e"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

func TestPurgeInbox(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	in, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if err := in.Process(ctx, "c", k, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.PurgeInbox(ctx, time.Now(), 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("PurgeInbox(limit 0) = %v, want idem.ErrInvalidArgument", err)
	}
	if n, err := in.PurgeInbox(ctx, time.Now().Add(-time.Hour), 10); err != nil || n != 0 {
		t.Errorf("PurgeInbox(an hour ago) = %d, %v; want 0, nil", n, err)
	}
	future := time.Now().Add(time.Hour)
	if n, err := in.PurgeInbox(ctx, future, 2); err != nil || n != 2 {
		t.Errorf("PurgeInbox(limit 2) = %d, %v; want 2, nil", n, err)
	}
	if n, err := in.PurgeInbox(ctx, future, 2); err != nil || n != 1 {
		t.Errorf("PurgeInbox again = %d, %v; want 1, nil", n, err)
	}
	// A purged message counts as new again: that is why the horizon must
	// outlast redeliveries.
	ran := false
	if err := in.Process(ctx, "c", "a", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Process after purge = %v (ran %v), want nil and a run", err, ran)
	}
}
