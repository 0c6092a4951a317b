package idemsqlite_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

// renewCounting is the store, telling each key's successful renewals.
type renewCounting struct {
	*idemsqlite.Store
	mu      sync.Mutex
	renewed map[idem.Key]int
	// enough is closed once every key of want has been renewed thrice.
	want   []idem.Key
	enough chan struct{}
}

func (s *renewCounting) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	end, err := s.Store.Renew(ctx, ref, lease)
	if err != nil {
		return end, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewed[ref.Key]++
	for _, k := range s.want {
		if s.renewed[k] < 3 {
			return end, nil
		}
	}
	select {
	case <-s.enough:
	default:
		close(s.enough)
	}
	return end, nil
}

// A handler in the transaction form that writes first, and so holds the
// single writer while it runs on past its lease, keeps its key: its
// renewals do not wait for the writer it holds; nor do those of another
// execution whose renewals fall due meanwhile. Each handler runs until
// both keys have been renewed three times, past the whole lease, where a
// lease that could not be renewed would have cancelled it.
func TestRenewWhileWriterHeld(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	const lease = 600 * time.Millisecond
	store := &renewCounting{Store: newStore(t, db, idem.SystemClock{}), renewed: map[idem.Key]int{},
		want: []idem.Key{"writes-first", "writes-later"}, enough: make(chan struct{})}
	entered := make(chan string, 2)
	h := mustMiddleware(t, &idemhttp.Config{SharedScope: true, Store: store, Lease: lease}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "writes-first" {
			if err := insertPayment(r.Context(), db, key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		entered <- key
		select {
		case <-store.enough:
		case <-r.Context().Done():
			http.Error(w, context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
			return
		}
		if key == "writes-later" {
			if err := insertPayment(r.Context(), db, key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
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
	// The second execution holds its key before the first takes the writer.
	later := do("writes-later")
	<-entered
	first := do("writes-first")
	<-entered
	for name, rr := range map[string]*httptest.ResponseRecorder{"writes-first": <-first, "writes-later": <-later} {
		if rr.Code != http.StatusCreated {
			t.Errorf("%s: %d %s", name, rr.Code, strings.TrimSpace(rr.Body.String()))
		}
	}
	if got := payments(t, db); !slices.Equal(got, []string{"writes-first", "writes-later"}) {
		t.Errorf("committed %v, want [writes-first writes-later]", got)
	}
}
