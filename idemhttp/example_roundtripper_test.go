package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// The client half: a RoundTripper gives the POST one key and sends it on
// every attempt. The first attempt's answer is lost (the server ran it,
// then the connection failed: here, a 503 from a proxy in front); the
// retry with the same key gets the first execution's answer, replayed, so
// the payment ran once.
func ExampleRoundTripper() {
	var executions atomic.Int64
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err != nil {
		panic(err)
	}
	protected := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := executions.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
	}))
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		protected.ServeHTTP(rec, r)
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the answer is lost on the way
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()

	client := &http.Client{Transport: &idemhttp.RoundTripper{
		Policy: idem.RetryPolicy{MaxAttempts: 3, Base: time.Millisecond, Cap: time.Millisecond},
	}}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idemhttp.HeaderReplayed))
	fmt.Println("attempts:", calls.Load(), "executions:", executions.Load())
	// Output:
	// 201 {"id":"pay_1"} replayed: true
	// attempts: 2 executions: 1
}
