package chi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprobe"
)

// TestProbe is the test an API team adds to its own go test: idemprobe
// probes the chi router, served in-process, and each of its checks, and
// each of the IETF draft's core behaviours, is a subtest (go test -v -run
// TestProbe ./chi lists them; -run TestProbe/lost-response runs one).
func TestProbe(t *testing.T) {
	t.Parallel()
	var created atomic.Int64
	keys, err := idemhttp.New(&idemhttp.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	// testFaults, inside the middleware, lets the probe make the handler
	// fail with no effect (check 7) or hold a request in flight (check 8).
	r.With(keys.Handler, testFaults).Post("/orders", func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, "not an order", http.StatusBadRequest)
			return
		}
		o.ID = created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(o)
	})
	// The effect, counted: how many orders were created.
	r.Get("/orders/count", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, created.Load()) })

	idemprobe.Test(t, &idemprobe.Config{
		Handler:     r,
		URL:         "/orders",
		Body:        `{"item":"book {{n}}"}`,
		CountURL:    "/orders/count",
		FaultHeader: "X-Test-Fault: fail",
		SlowHeader:  "X-Test-Fault: delay",
		History:     80,
		Cases:       idemprobe.DraftCases(),
	})
}

// testFaults answers 503 with no effect to X-Test-Fault: fail, and holds
// a request with X-Test-Fault: delay for a second before handing it on:
// long past the probe's head start (200ms), so that its duplicate arrives
// while it is in flight even on a loaded machine.
func testFaults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Test-Fault") {
		case "fail":
			http.Error(w, "injected", http.StatusServiceUnavailable)
			return
		case "delay":
			select {
			case <-time.After(time.Second):
			case <-r.Context().Done():
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
