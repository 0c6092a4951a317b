package servemux_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/idem-go/idem/examples/internal/show"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

type order struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
}

func Example() {
	var created atomic.Int64
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, "not an order", http.StatusBadRequest) // a 4xx is kept and replayed too
			return
		}
		o.ID = created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(o)
	})

	keys, err := idemhttp.New(&idemhttp.Config{
		Store: idemmem.NewStore(nil),
		// One caller here. A service with several gives Scope instead, so
		// that each caller's keys are its own.
		SharedScope: true,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Handler(createOrder))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// The client makes one key per order and sends it with every attempt.
	const key = "3f1c2b9e-7d4a-4c52-9b1e-0a6f8d2c4e71"
	show.Post(srv.URL+"/orders", key, `{"item":"book"}`)
	show.Post(srv.URL+"/orders", key, `{"item":"book"}`) // a retry
	show.Post(srv.URL+"/orders", key, `{"item":"lamp"}`) // the key reused for another order
	fmt.Println("orders created:", created.Load())
	// Output:
	// 201 replayed="" {"id":1,"item":"book"}
	// 201 replayed="true" {"id":1,"item":"book"}
	// 422 replayed="" urn:idem:problem:idempotency-key-mismatch
	// orders created: 1
}
