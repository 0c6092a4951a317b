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
	"github.com/idem-go/idem/idemsqlite"
)

// Every payment is announced by an event written with it, relayed to the
// embedded transport and settled once: a retry of the payment charges and
// settles nothing more.
func Example_settlement() {
	dir, err := os.MkdirTemp("", "payments-settlement")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "payments.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	svc, err := payments.New(context.Background(), &payments.Config{DB: db, APIKeys: map[string]string{"sk_test": "acme"}})
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()

	call := func(method, path, key, body string) string {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if method == http.MethodPost && path == "/v1/accounts" {
			return strings.TrimPrefix(res.Header.Get("Location"), "/v1/accounts/")
		}
		return strings.TrimSpace(string(b))
	}
	id := call("POST", "/v1/accounts", "", `{"balance":10000,"currency":"KRW"}`)
	for range 2 {
		call("POST", "/v1/payments", "order-1", `{"account_id":"`+id+`","amount":3000,"currency":"KRW"}`)
	}
	// Settlement is asynchronous: wait for it, with a deadline.
	want := `{"currency":"KRW","total":3000,"events":1,"refunds":0}`
	got := ""
	for deadline := time.Now().Add(30 * time.Second); got != want && time.Now().Before(deadline); {
		if got = call("GET", "/v1/settlement", "", ""); got != want {
			time.Sleep(10 * time.Millisecond)
		}
	}
	fmt.Println(got)
	// Output: {"currency":"KRW","total":3000,"events":1,"refunds":0}
}
