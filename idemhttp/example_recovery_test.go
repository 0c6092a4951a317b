package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A handler whose work leaves the database (a charge at a card network)
// runs in phases: it saves a recovery point before the call, with what the
// call needs, so that an execution that dies after the call is finished,
// by the client's retry or, with nobody asking, by a Completer, instead of
// being run again from the start. Every execution sends the card network
// the same key, derived from the client's and named for the call
// (DownstreamKey), the completer's too.
func ExampleSaveRecovery() {
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock}) // an idem.Recoverer, as idemsqlite's and idempg's are
	m, _ := idemhttp.New(&idemhttp.Config{Store: store, SharedScope: true, Lease: 10 * time.Second, Clock: clock, SeparateTx: true})

	charges := map[string]int{} // the card network: charges by key
	charge := func(ctx context.Context) {
		key, _ := idemhttp.DownstreamKey(ctx, "charge")
		charges[key]++ // idempotent by key at the network
	}
	crash := true
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ex, _ := idemhttp.ExecutionFromContext(r.Context()); ex.Recovery.IsZero() {
			// Phase 1: say what the charge will be before making it.
			if err := idemhttp.SaveRecovery(r.Context(), "charging", []byte(`{"amount":1000}`)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		charge(r.Context())
		if crash {
			crash = false
			panic("the execution fails between the charge and its commit")
		}
		w.WriteHeader(http.StatusCreated)
	})
	completer, _ := m.NewCompleter(&idemhttp.CompleterConfig{
		Resume: func(ctx context.Context, w http.ResponseWriter, ex idemhttp.Execution) error {
			fmt.Printf("completer: going on from %q with %s\n", ex.Recovery.Name, ex.Recovery.Data)
			charge(ctx) // the same key: the network answers with the charge it made
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"status":"succeeded"}`)
			return nil
		},
	})

	send := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Idempotency-Key", "order-42")
		rec := httptest.NewRecorder()
		m.Handler(pay).ServeHTTP(rec, req)
		return rec
	}
	fmt.Println("first attempt:", send().Code)
	clock.Advance(time.Second) // the client never retried
	n, _ := completer.RunOnce(context.Background())
	fmt.Println("finished by the completer:", n)
	later := send()
	fmt.Println("the client comes back:", later.Code, later.Body.String(), later.Header().Get(idemhttp.HeaderReplayed))
	for _, n := range charges {
		fmt.Println("charge requests:", n, "under one key of", len(charges))
	}
	// Output:
	// first attempt: 503
	// completer: going on from "charging" with {"amount":1000}
	// finished by the completer: 1
	// the client comes back: 201 {"status":"succeeded"} true
	// charge requests: 2 under one key of 1
}
