package idemsqlite_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// A claim that waits long for the writer (held by another execution's
// transaction) begins its lease when its turn comes, by the store's clock,
// which is the engine's: it returns with the whole lease left. Its
// execution is not cancelled at the next tick for a lease counted from
// when the claim was sent, most of which went by in the writer's queue;
// it runs, renews its lease, and completes.
func TestMiddlewareClaimThatWaitedForTheWriterKeepsItsLease(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	timers := tickTimers{clock, make(chan struct{}, 1)}
	const lease, tick = 3 * time.Second, 500 * time.Millisecond
	wroteA, letA, letB := make(chan struct{}), make(chan struct{}), make(chan struct{})
	ctxs := make(chan context.Context, 1)
	h := mustMiddleware(t, &idemhttp.Config{SharedScope: true, Store: newStore(t, db, clock), Clock: clock, Timers: timers,
		Lease: lease, Timeout: time.Hour}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "b" {
			ctxs <- r.Context()
			<-letB
			if err := r.Context().Err(); err != nil {
				http.Error(w, context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
				return
			}
		}
		if err := insertPayment(r.Context(), db, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if key == "a" {
			// Holds the writer, its transaction open, until let go.
			close(wroteA)
			<-letA
		}
		w.WriteHeader(http.StatusCreated)
	}))
	do := func(key string) <-chan *httptest.ResponseRecorder {
		out := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idemhttp.HeaderKey, key)
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			out <- rr
		}()
		return out
	}
	a := do("a")
	<-timers.set // the heartbeat's first tick set, at a's claim
	<-wroteA
	b := do("b")
	idemsqlite.WaitingForWriter(t, db, 1) // b's claim, behind a's transaction
	// b's claim waits five sixths of the lease for the writer.
	for range 5 {
		clock.Advance(tick)
		<-timers.set
	}
	close(letA)
	if rr := <-a; rr.Code != http.StatusCreated {
		t.Fatalf("a: %d %s; want 201", rr.Code, rr.Body)
	}
	var bctx context.Context
	select {
	case bctx = <-ctxs:
	case rr := <-b:
		t.Fatalf("b's handler did not run: %d %s", rr.Code, rr.Body)
	}
	defer func() {
		select {
		case <-letB:
		default:
			close(letB)
			<-b
		}
	}()
	// Its lease began when the claim took the writer: four ticks leave it
	// a third of its lease, unrenewed, and it is renewed meanwhile.
	for i := 1; i <= 4; i++ {
		clock.Advance(tick)
		<-timers.set
		if err := bctx.Err(); err != nil {
			t.Fatalf("b's handler was cancelled %v after its claim returned, its lease begun when the claim took the writer %v after it was sent: %v",
				time.Duration(i)*tick, 5*tick, context.Cause(bctx))
		}
	}
	close(letB)
	if rr := <-b; rr.Code != http.StatusCreated {
		t.Fatalf("b: %d %s; want 201", rr.Code, rr.Body)
	}
	if got := payments(t, db); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("committed %v; want [a b]", got)
	}
}
