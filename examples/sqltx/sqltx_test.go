package sqltx_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

// An answer that is not kept takes the handler's writes with it: the order
// inserted before a 503 is rolled back and the key freed, so the retry
// inserts the one order there is.
func TestAnswerNotKeptRollsTheOrderBack(t *testing.T) {
	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "shop.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	store, err := idemsqlite.NewStore(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := idemhttp.New(&idemhttp.Config{Store: store, SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	attempts := 0
	srv := httptest.NewServer(keys.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts++
		err := db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES ('book')`)
			return err
		})
		switch {
		case err != nil:
			t.Error(err)
			w.WriteHeader(http.StatusInternalServerError)
		case attempts == 1:
			w.WriteHeader(http.StatusServiceUnavailable) // after the insert
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})))
	t.Cleanup(srv.Close)

	rows := func() int {
		var n int
		if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, want := range []struct{ status, rows int }{{http.StatusServiceUnavailable, 0}, {http.StatusCreated, 1}, {http.StatusCreated, 1}} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderKey, "order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want.status || rows() != want.rows {
			t.Errorf("answer %d with %d order rows, want %d with %d", resp.StatusCode, rows(), want.status, want.rows)
		}
	}
	if attempts != 2 {
		t.Errorf("handler ran %d times, want 2 (the 503, then the retry)", attempts)
	}
}
