package payments_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsqlite"
)

// A payment sent twice with the same Idempotency-Key charges once: the
// second answer is the first one, replayed.
func Example() {
	dir, err := os.MkdirTemp("", "payments-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "payments.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	keys, err := payments.ParseAPIKeys("acme:sk_test_acme")
	if err != nil {
		log.Fatal(err)
	}
	svc, err := payments.New(context.Background(), &payments.Config{DB: db, APIKeys: keys})
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()

	post := func(path, key, body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		return res
	}

	res := post("/v1/accounts", "", `{"balance":10000,"currency":"KRW"}`)
	id := strings.TrimPrefix(res.Header.Get("Location"), "/v1/accounts/")
	res.Body.Close()

	body := `{"account_id":"` + id + `","amount":3000,"currency":"KRW"}`
	for range 2 {
		res := post("/v1/payments", "7f3c9a52-order-1138", body)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, "replayed:", res.Header.Get("Idempotent-Replayed") == "true")
	}

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/accounts/"+id, nil)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	res, err = srv.Client().Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	fmt.Println(strings.Contains(string(b), `"balance":7000`))
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// true
}

// In unsafe mode the Idempotency-Key header is ignored: the same payment
// sent twice, as a client retrying after a lost answer would, charges twice.
func Example_unsafe() {
	dir, err := os.MkdirTemp("", "payments-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "payments.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	svc, err := payments.New(context.Background(), &payments.Config{
		DB:      db,
		APIKeys: map[string]string{"sk_test_acme": "acme"},
		Unsafe:  true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	h := svc.Handler()

	call := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.Set("Idempotency-Key", "7f3c9a52-order-1138")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	acct := call("POST", "/v1/accounts", `{"balance":10000,"currency":"KRW"}`)
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	body := `{"account_id":"` + id + `","amount":3000,"currency":"KRW"}`
	for range 2 {
		rec := call("POST", "/v1/payments", body)
		fmt.Println(rec.Code, rec.Header().Get("Idem-Mode"))
	}
	fmt.Println(strings.Contains(call("GET", "/v1/accounts/"+id, "").Body.String(), `"balance":4000`))
	// Output:
	// 201 unsafe
	// 201 unsafe
	// true
}

func ExampleParseAPIKeys() {
	keys, err := payments.ParseAPIKeys("acme:sk_live_1,acme:sk_live_2,globex:sk_live_3")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(keys["sk_live_2"], keys["sk_live_3"])
	// Output: acme globex
}

// Replicas behind a load balancer share one PostgreSQL schema. Without
// Keys, every payment commits in one PostgreSQL transaction with its
// idempotency key; with Keys, the keys live in Redis and the payment's
// unique (tenant, key, claim time) constraint covers a crash between the
// payment's commit and the key's completion (see "Two stores").
func Example_postgres() {
	ctx := context.Background()
	db, err := idempg.Open(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", &idempg.Config{Schema: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	keys, err := idemredis.Open(ctx, "redis://127.0.0.1:6379/0", &idemredis.Config{Prefix: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	defer keys.Close()

	svc, err := payments.New(ctx, &payments.Config{
		Postgres: db,
		Keys:     keys, // leave out to keep the keys in PostgreSQL
		KeyLease: 30 * time.Second,
		APIKeys:  map[string]string{"sk_live_acme": "acme"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	if err := http.ListenAndServe("127.0.0.1:8080", svc.Handler()); err != nil {
		log.Print(err)
	}
}
