package idemhttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A handler that returns without writing anything has answered 200 with
// an empty body, which is kept and replayed; one that returns without
// writing because its context ended at Timeout has not answered at all:
// nothing is kept, the key is released, and the retry runs it again. The
// kept answer holds the replayed headers the handler set, and no other
// name.
func TestHandlerThatWritesNothing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		waitToEnd bool // the handler returns once its context ends
		wantRuns  int  // of two requests with one key
		// timeout is the Config's: far beyond a handler that returns at
		// once, so that a loaded machine's pause between the claim and
		// its return is not taken for a handler timed out.
		timeout time.Duration
	}{
		{"returns at once: an empty 200, kept", false, 1, 10 * time.Second},
		{"gives up at its Timeout: nothing kept", true, 2, 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			store := idemmem.NewStore(nil)
			m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: store, Timeout: c.timeout, ReplayHeaders: []string{"X-Receipt"}})
			runs := 0
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				if c.waitToEnd {
					<-r.Context().Done()
				}
			}))
			var codes []int
			for range 2 {
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
				req.Header.Set(idemhttp.HeaderKey, "k")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				codes = append(codes, rec.Code)
			}
			if runs != c.wantRuns {
				t.Fatalf("ran %d times for two requests with one key (answers %v); want %d", runs, codes, c.wantRuns)
			}
			rec, err := store.Get(t.Context(), "", "k")
			switch {
			case c.waitToEnd && (err == nil && rec.State == idem.StateCompleted || err != nil && !errors.Is(err, idem.ErrNotFound)):
				t.Errorf("the key after a handler that gave up: %+v, %v; want no answer kept", rec, err)
			case !c.waitToEnd && (err != nil || rec.Response == nil || rec.Response.Status != http.StatusOK || len(rec.Response.Body) != 0 || len(rec.Response.Header) != 0):
				t.Errorf("the kept answer of a handler that wrote nothing: %+v, %v; want an empty 200 with no header", rec.Response, err)
			}
		})
	}
}
