package sqltx_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing/fstest"

	"github.com/idem-go/idem/examples/internal/show"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

type order struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
}

func Example() {
	dir, err := os.MkdirTemp("", "sqltx-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "shop.db"), nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	// The application's tables live in the same file as the keys, migrated
	// under the application's own name (an embed.FS in a real service).
	err = db.Migrate(ctx, "shop", fstest.MapFS{
		"0001_orders.sql": {Data: []byte(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL);`)},
	})
	if err != nil {
		panic(err)
	}
	store, err := idemsqlite.NewStore(ctx, db, nil)
	if err != nil {
		panic(err)
	}

	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, "not an order", http.StatusBadRequest)
			return
		}
		// r.Context() carries the transaction that will keep this answer:
		// WithTx joins it, so the order commits with the key's record.
		err := db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, o.Item)
			if err != nil {
				return err
			}
			o.ID, err = res.LastInsertId()
			return err
		})
		if err != nil {
			// A 5xx is not kept: the insert is rolled back and the key freed.
			http.Error(w, "could not take the order", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(o)
	})

	keys, err := idemhttp.New(&idemhttp.Config{
		Store:       store,
		SharedScope: true, // one caller here; a service with several gives Scope
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Handler(createOrder))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	const key = "3f1c2b9e-7d4a-4c52-9b1e-0a6f8d2c4e71"
	show.Post(srv.URL+"/orders", key, `{"item":"book"}`)
	show.Post(srv.URL+"/orders", key, `{"item":"book"}`) // a retry
	show.Post(srv.URL+"/orders", key, `{"item":"lamp"}`) // the key reused for another order

	var rows int
	if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Println("order rows:", rows)
	// Output:
	// 201 replayed="" {"id":1,"item":"book"}
	// 201 replayed="true" {"id":1,"item":"book"}
	// 422 replayed="" urn:idem:problem:idempotency-key-mismatch
	// order rows: 1
}
