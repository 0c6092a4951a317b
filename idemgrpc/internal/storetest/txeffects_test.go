package storetest_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// effectsDB is a database the handler writes its effect to, in the
// transaction the interceptor keeps the answer in.
type effectsDB struct {
	store  idem.Store
	insert func(ctx context.Context, key string) error // joins ctx's transaction
	count  func(t *testing.T) int
}

// The handler's write commits with the kept answer or not at all: a
// transient status rolls it back, and a duplicate of the kept answer
// writes nothing.
func TestTxEffectsSQLite(t *testing.T) {
	t.Parallel()
	db := openSQLite(t)
	if err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE payments (key TEXT NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	txEffects(t, effectsDB{
		store: sqliteStore(t, db, idemmem.NewClock(start)),
		insert: func(ctx context.Context, key string) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO payments (key) VALUES (?)`, key)
				return err
			})
		},
		count: func(t *testing.T) int {
			var n int
			if err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
				return tx.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n)
			}); err != nil {
				t.Fatal(err)
			}
			return n
		},
	})
}

func TestTxEffectsPostgres(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
	db := openPG(t, url, idemmem.NewClock(start))
	if err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE payments (key text NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	txEffects(t, effectsDB{
		store: pgStore(t, db),
		insert: func(ctx context.Context, key string) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO payments (key) VALUES ($1)`, key)
				return err
			})
		},
		count: func(t *testing.T) int {
			var n int
			if err := db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
				return tx.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n)
			}); err != nil {
				t.Fatal(err)
			}
			return n
		},
	})
}

func txEffects(t *testing.T, e effectsDB) {
	h := grpcsuite.New(t, idemgrpc.Config{Store: e.store, SharedScope: true}, nil)
	attempts := 0
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		attempts++
		if err := e.insert(ctx, "k"); err != nil {
			return nil, err
		}
		if attempts == 1 {
			// Written, then a transient failure: the write must not stay.
			return nil, status.Error(codes.Unavailable, "the card network timed out")
		}
		return grpcsuite.Msg(t, map[string]any{"id": "pay_1"}), nil
	})
	req := grpcsuite.Msg(t, map[string]any{"amount": 10})
	if _, _, err := h.Call(t.Context(), "k", req); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call: %v, want Unavailable", err)
	}
	if n := e.count(t); n != 0 {
		t.Fatalf("after a transient failure %d payments are recorded, want 0 (rolled back)", n)
	}
	for i := range 3 {
		out, header, err := h.Call(t.Context(), "k", req)
		if err != nil || out.Fields["id"].GetStringValue() != "pay_1" {
			t.Fatalf("call %d: %v %v", i+2, out, err)
		}
		if replayed := header[idemgrpc.MetadataReplayed] != nil; replayed != (i > 0) {
			t.Fatalf("call %d: replayed %v", i+2, replayed)
		}
	}
	if n := e.count(t); n != 1 {
		t.Fatalf("%d payments recorded, want 1", n)
	}
}
