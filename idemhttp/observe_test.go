package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A duplicate that waits for the execution in flight ends its claim when
// it gets the execution's answer, replayed.
func TestObserverSeesWaitingDuplicate(t *testing.T) {
	t.Parallel()
	rec := &recording{}
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Observer: rec, RecentKeys: -1})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusCreated)
	}))
	send := func() {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.HeaderKey, "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	var wg sync.WaitGroup
	wg.Go(send)
	<-entered
	wg.Go(send)
	// The duplicate is waiting once its claim saw the key in flight.
	time.AfterFunc(50*time.Millisecond, func() { close(release) })
	wg.Wait()
	_, ends, _ := rec.Take()
	var outcomes, claims []string
	for _, e := range ends {
		switch e.Phase {
		case idemhttp.PhaseRequest:
			outcomes = append(outcomes, string(e.Outcome))
		case idemhttp.PhaseClaim:
			claims = append(claims, e.Claim)
		}
	}
	slices.Sort(outcomes)
	slices.Sort(claims)
	if !slices.Equal(outcomes, []string{"executed", "replayed"}) || !slices.Equal(claims, []string{"acquired", "completed"}) {
		t.Fatalf("outcomes %v, claims %v; want executed and replayed, acquired and completed", outcomes, claims)
	}
}

// Observers passes each Begin's context on, and skips nil observers.
func TestObservers(t *testing.T) {
	t.Parallel()
	if idemhttp.Observers(nil, nil) != nil {
		t.Fatal("Observers of nothing is not nil")
	}
	a, b := &recording{}, &recording{}
	if idemhttp.Observers(nil, a) != idemhttp.Observer(a) {
		t.Fatal("Observers of one observer is not that observer")
	}
	o := idemhttp.Observers(a, nil, b)
	ctx := o.Begin(context.Background(), idemhttp.Event{Phase: idemhttp.PhaseClaim})
	o.End(ctx, idemhttp.Event{Phase: idemhttp.PhaseClaim})
	o.Store(ctx, idemhttp.StoreClaim, time.Millisecond, nil)
	for _, r := range []*recording{a, b} {
		log, _, stores := r.Take()
		if !slices.Equal(log, []string{"+claim", "-claim"}) || len(stores) != 1 {
			t.Fatalf("log %v, stores %v", log, stores)
		}
	}
}

// nopObserver observes nothing, for the benchmark of the seam.
type nopObserver struct{}

func (nopObserver) Begin(ctx context.Context, _ idemhttp.Event) context.Context   { return ctx }
func (nopObserver) End(context.Context, idemhttp.Event)                           {}
func (nopObserver) Store(context.Context, idemhttp.StoreOp, time.Duration, error) {}

// A request the middleware lets through unprotected (no key where keys
// are optional, a method it does not protect) is none of the engine's: an
// Observer sees nothing of it and nothing is counted, as on idemgrpc.
func TestObserverSeesNothingOfUnprotectedRequests(t *testing.T) {
	t.Parallel()
	rec := &recording{}
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Observer: rec, Optional: true})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, "/pay", strings.NewReader(`{}`)))
	}
	if log, _, _ := rec.Take(); len(log) != 0 {
		t.Fatalf("the observer saw %q of requests let through unprotected; want nothing", log)
	}
	for o, n := range m.Counts() {
		if n != 0 {
			t.Fatalf("%s counted %d; want nothing counted", o, n)
		}
	}
	// A keyed request is observed.
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
	req.Header.Set(idemhttp.HeaderKey, "k")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if log, _, _ := rec.Take(); !slices.Contains(log, "+request") {
		t.Fatalf("the observer saw %q of a keyed request", log)
	}
}
