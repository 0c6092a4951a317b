package probe_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/idem-go/idem/cmd/idem/internal/probe"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// Probing an endpoint built on idemhttp: every applicable check passes.
// The checks that need the server's help (a fault that makes it answer 5xx,
// a delay that keeps a request in flight) are not applicable without
// Config.FaultHeader and Config.SlowHeader.
func Example() {
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	if err != nil {
		panic(err)
	}
	var n atomic.Int64
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, n.Add(1))
	})))
	defer srv.Close()

	rep, err := probe.Run(context.Background(), &probe.Config{
		URL:  srv.URL + "/v1/payments",
		Body: `{"amount":{{n}}}`,
		Header: http.Header{
			"Content-Type": {"application/json"},
		},
	})
	if err != nil {
		panic(err)
	}
	for _, c := range rep.Checks {
		fmt.Println(c.Name, c.Status)
	}
	fmt.Println("all applicable checks pass:", rep.OK())
	// Output:
	// concurrent-duplicates pass
	// sequential-replay pass
	// key-reuse-refused pass
	// missing-key-refused pass
	// malformed-key-refused pass
	// lost-response pass
	// no-credentials-replayed pass
	// 5xx-not-kept n/a
	// in-flight-duplicate n/a
	// scope-isolation n/a
	// revoked-credential n/a
	// key-expiry n/a
	// history-linearizable n/a
	// all applicable checks pass: true
}
