package idempg_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/idempg"
)

// The pgx.Tx that WithTx hands out begins its transaction with its first
// statement, whichever method sends it, and behaves as pgx's own: writes
// commit with fn's nil and roll back with its error, failed statements
// surface their error, savepoints nest, and a Commit or Rollback by fn ends
// the transaction for the owner too.
func TestWithTxFirstStatement(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	errUndo := errors.New("undo")
	insert := `INSERT INTO payments (id, amount) VALUES ($1, $2)`
	cases := []struct {
		name    string
		fn      func(ctx context.Context, tx pgx.Tx) error
		wantErr error // errAny: some error
		want    []string
	}{
		{name: "Exec with arguments", fn: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, "a", 1)
			return err
		}, want: []string{"a"}},
		{name: "Exec with arguments, rolled back", fn: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, "a", 1); err != nil {
				return err
			}
			return errUndo
		}, wantErr: errUndo},
		{name: "Exec without arguments", fn: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ('a', 1); INSERT INTO payments (id, amount) VALUES ('b', 2)`)
			return err
		}, want: []string{"a", "b"}},
		{name: "Exec with a query option", fn: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, "a", 1)
			return err
		}, want: []string{"a"}},
		{name: "failing first statement", fn: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2::int / 0)`, "a", 1)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
				t.Errorf("first statement = %v, want division_by_zero", err)
			}
			return err
		}, wantErr: errAny},
		{name: "Query", fn: func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `INSERT INTO payments (id, amount) VALUES ($1, 1), ($2, 2) RETURNING id`, "a", "b")
			if err != nil {
				return err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			if !slices.Equal(ids, []string{"a", "b"}) {
				t.Errorf("returned ids %v", ids)
			}
			// The connection is free again: a second statement runs.
			_, err = tx.Exec(ctx, insert, "c", 3)
			return err
		}, want: []string{"a", "b", "c"}},
		{name: "Query read to the end without Close", fn: func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, $1::int) g`, 3)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil || n != 3 {
				t.Errorf("read %d rows, %v", n, err)
			}
			_, err = tx.Exec(ctx, insert, "a", 1)
			return err
		}, want: []string{"a"}},
		{name: "Query failing", fn: func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT 1 / $1::int`, 0)
			if err == nil {
				for rows.Next() {
				}
				rows.Close()
				err = rows.Err()
			}
			return err
		}, wantErr: errAny},
		{name: "QueryRow", fn: func(ctx context.Context, tx pgx.Tx) error {
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO payments (id, amount) VALUES ($1, 1) RETURNING id`, "a").Scan(&id); err != nil {
				return err
			}
			if id != "a" {
				t.Errorf("returned id %q", id)
			}
			return nil
		}, want: []string{"a"}},
		{name: "QueryRow without rows", fn: func(ctx context.Context, tx pgx.Tx) error {
			var id string
			err := tx.QueryRow(ctx, `SELECT id FROM payments WHERE id = $1`, "none").Scan(&id)
			if !errors.Is(err, pgx.ErrNoRows) {
				t.Errorf("QueryRow = %v, want pgx.ErrNoRows", err)
			}
			_, err = tx.Exec(ctx, insert, "a", 1)
			return err
		}, want: []string{"a"}},
		{name: "SendBatch", fn: func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(insert, "a", 1)
			b.Queue(insert, "b", 2)
			return tx.SendBatch(ctx, b).Close()
		}, want: []string{"a", "b"}},
		{name: "CopyFrom", fn: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"payments"}, []string{"id", "amount"},
				pgx.CopyFromRows([][]any{{"a", int64(1)}, {"b", int64(2)}}))
			return err
		}, want: []string{"a", "b"}},
		{name: "Conn is inside the transaction", fn: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Conn().Exec(ctx, insert, "a", 1); err != nil {
				return err
			}
			return errUndo
		}, wantErr: errUndo},
		{name: "savepoints", fn: func(ctx context.Context, tx pgx.Tx) error {
			kept, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := kept.Exec(ctx, insert, "a", 1); err != nil {
				return err
			}
			undone, err := kept.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := undone.Exec(ctx, insert, "b", 2); err != nil {
				return err
			}
			if err := undone.Rollback(ctx); err != nil {
				return err
			}
			if _, err := undone.Exec(ctx, insert, "c", 3); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("Exec on a rolled back savepoint = %v, want pgx.ErrTxClosed", err)
			}
			return kept.Commit(ctx)
		}, want: []string{"a"}},
		{name: "Commit by fn", fn: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, "a", 1); err != nil {
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, insert, "b", 2); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("Exec after Commit = %v, want pgx.ErrTxClosed", err)
			}
			return nil
		}, wantErr: pgx.ErrTxClosed, want: []string{"a"}},
		{name: "Rollback by fn", fn: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, "a", 1); err != nil {
				return err
			}
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("second Rollback = %v, want pgx.ErrTxClosed", err)
			}
			return nil
		}, wantErr: pgx.ErrTxClosed},
		{name: "no statement", fn: func(ctx context.Context, tx pgx.Tx) error { return nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// One connection: a transaction or batch left open would keep
			// the check below waiting.
			db := openDB(t, url, idempg.Config{MaxConns: 1})
			migratePayments(t, db)
			err := db.WithTx(t.Context(), tc.fn)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("WithTx = %v, want nil", err)
			case tc.wantErr == errAny && err == nil:
				t.Errorf("WithTx = nil, want an error")
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Errorf("WithTx = %v, want %v", err, tc.wantErr)
			}
			got := payments(t, db)
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("committed payments = %v, want %v", got, tc.want)
			}
		})
	}
}
