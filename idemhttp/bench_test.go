package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// BenchmarkMiddleware measures the middleware in front of a trivial handler
// on the in-memory store (each database store's module measures it on that
// store), for first executions and for replays, beside the bare
// handler as the baseline of the same run. Compare with benchstat, or read
// the ns/op ratios directly:
//
//	go test -run '^$' -bench Middleware -benchtime 2s ./idemhttp/
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"pay_123","status":"succeeded"}`))
	})
	body := `{"account_id":"acct_1","amount":12000,"currency":"KRW","description":"coffee"}`
	serve := func(b *testing.B, h http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		if rr.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", rr.Code, rr.Body)
		}
	}
	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			serve(b, handler, "")
		}
	})
	stores := map[string]func(b *testing.B) idem.Store{
		"mem": func(*testing.B) idem.Store { return idemmem.NewStore(nil) },
	}
	// The same with an Observer that does nothing: what the seam itself
	// costs once it is set (unset, it costs nothing: compare mem/first
	// with the run before the seam existed).
	b.Run("mem/first/observed", func(b *testing.B) {
		m, _ := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: stores["mem"](b), Observer: nopObserver{}})
		h := m.Handler(handler)
		i := 0
		for b.Loop() {
			i++
			serve(b, h, fmt.Sprintf("first-%d", i))
		}
	})
	for _, name := range []string{"mem"} {
		b.Run(name+"/first", func(b *testing.B) {
			m, _ := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: stores[name](b)})
			h := m.Handler(handler)
			i := 0
			for b.Loop() {
				i++
				serve(b, h, fmt.Sprintf("first-%d", i))
			}
		})
		b.Run(name+"/replay", func(b *testing.B) {
			m, _ := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: stores[name](b)})
			h := m.Handler(handler)
			serve(b, h, "replayed")
			for b.Loop() {
				serve(b, h, "replayed")
			}
		})
	}
}
