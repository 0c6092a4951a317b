package idemsqlite_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// tickTimers are a manual clock's timers that say when one is set: the
// engine's heartbeat sets its next tick once a tick has run.
type tickTimers struct {
	*idemmem.Clock
	set chan struct{}
}

func (c tickTimers) AfterFunc(d time.Duration, f func()) func() bool {
	defer func() { c.set <- struct{}{} }()
	return c.Clock.AfterFunc(d, f)
}

// A handler that writes first and then runs three times its lease (a slow
// call past the database's edge) holds SQLite's only writer all along, in
// the CompleteTx form the middleware chooses for the store: its renewals
// wait for that writer and cannot land, and neither can another's
// takeover. It is not cancelled for want of renewals: it completes, its
// writes and its answer kept.
func TestMiddlewareWriterHeldPastTheLease(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	timers := tickTimers{clock, make(chan struct{}, 1)}
	const lease = 12 * time.Second
	wrote, letGo := make(chan struct{}), make(chan struct{})
	h := mustMiddleware(t, &idemhttp.Config{SharedScope: true, Store: newStore(t, db, clock), Clock: clock, Timers: timers,
		Lease: lease, Timeout: time.Hour}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := insertPayment(r.Context(), db, "slow"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		close(wrote)
		<-letGo
		if err := r.Context().Err(); err != nil {
			t.Errorf("the handler's context ended while it held the writer: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, "slow")
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		out <- rr
	}()
	<-timers.set // the heartbeat's first tick set
	<-wrote
	for range 3 * 6 {
		clock.Advance(lease / 6)
		<-timers.set // the tick ran, and set the next
	}
	close(letGo)
	if rr := <-out; rr.Code != http.StatusCreated {
		t.Fatalf("the long execution: %d %s; want 201", rr.Code, rr.Body)
	}
	if got := payments(t, db); !slices.Equal(got, []string{"slow"}) {
		t.Fatalf("committed %v; want [slow]", got)
	}
}
