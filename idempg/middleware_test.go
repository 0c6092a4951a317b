package idempg_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// claimCounter is an idemhttp.Observer that counts the claims begun.
type claimCounter struct{ n atomic.Int32 }

func (c *claimCounter) Begin(ctx context.Context, e idemhttp.Event) context.Context {
	if e.Phase == idemhttp.PhaseClaim {
		c.n.Add(1)
	}
	return ctx
}
func (c *claimCounter) End(context.Context, idemhttp.Event)                           {}
func (c *claimCounter) Store(context.Context, idemhttp.StoreOp, time.Duration, error) {}

// The store claims keys in the request's transaction, so a duplicate
// waiting in the database would hold a pool connection. A burst of
// duplicates of one slow request must not take the whole pool: they wait at
// the key's gate in the process, and a request for another key still gets
// a connection and runs. Once the slow one commits, every duplicate replays
// its answer.
func TestDuplicatesOfASlowRequestLeaveThePoolToOthers(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgURL(t), idempg.Config{MaxConns: 2})
	store := newStore(t, db)
	claims := &claimCounter{}
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: store, InflightWait: time.Minute, Observer: claims})
	if err != nil {
		t.Fatal(err)
	}

	entered := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	// Registered after the DB's cleanup, so it runs first: a failing test
	// lets the slow request go before the pool is closed.
	t.Cleanup(letGo)
	var slowRuns atomic.Int32
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, key, _ := idemhttp.KeyFromContext(r.Context())
		if key == "slow" {
			slowRuns.Add(1)
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done "+string(key))
	}))
	send := func(ctx context.Context, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, key)
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}

	const dups = 10
	answers := make(chan *httptest.ResponseRecorder, dups+1)
	var wg sync.WaitGroup
	wg.Go(func() { answers <- send(t.Context(), "slow") })
	<-entered
	for range dups {
		wg.Go(func() { answers <- send(t.Context(), "slow") })
	}
	idemtest.Eventually(t, 10*time.Second, "every duplicate claiming", func() bool {
		return claims.n.Load() == dups+1
	})

	// The slow request holds one of the two connections; the other is free
	// for another key.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	other := send(ctx, "other")
	cancel()
	if other.Code != http.StatusCreated || other.Body.String() != "done other" {
		t.Fatalf("another key while duplicates wait: %d %s", other.Code, other.Body)
	}

	letGo()
	wg.Wait()
	close(answers)
	replayed := 0
	for rr := range answers {
		if rr.Code != http.StatusCreated || rr.Body.String() != "done slow" {
			t.Errorf("slow key: %d %s", rr.Code, rr.Body)
		}
		if rr.Header().Get(idemhttp.HeaderReplayed) == "true" {
			replayed++
		}
	}
	if n := slowRuns.Load(); n != 1 || replayed != dups {
		t.Fatalf("the slow handler ran %d times and %d answers were replays; want 1 and %d", n, replayed, dups)
	}
}
