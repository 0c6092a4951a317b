package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// serveWith runs one protected request whose context is ctx through a
// middleware with the given handler timeout, and returns what the handler
// saw.
func serveWith(t *testing.T, ctx context.Context, timeout time.Duration, handler func(w http.ResponseWriter, r *http.Request)) {
	t.Helper()
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Timeout: timeout})
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`)).WithContext(ctx)
	req.Header.Set(idemhttp.HeaderKey, "k")
	m.Handler(http.HandlerFunc(handler)).ServeHTTP(httptest.NewRecorder(), req)
}

// TestHandlerContextDeadline: the handler's context ends at its Timeout
// (not the lease's), with the deadline it reports, and carries the
// Execution.
func TestHandlerContextDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	start := time.Now()
	ran := false
	serveWith(t, context.Background(), timeout, func(w http.ResponseWriter, r *http.Request) {
		ran = true
		ctx := r.Context()
		if ex, ok := idemhttp.ExecutionFromContext(ctx); !ok || ex.Key != "k" || ex.Token == 0 {
			t.Errorf("ExecutionFromContext = %+v, %v", ex, ok)
		}
		d, ok := ctx.Deadline()
		if !ok || d.Before(start.Add(timeout)) || d.After(time.Now().Add(timeout)) {
			t.Errorf("Deadline = %v, %v; want the Timeout from the claim", d, ok)
		}
		// A loaded machine may start the handler past its deadline: only an
		// error read before the deadline says the context ended early.
		if err := ctx.Err(); err != nil && time.Now().Before(d) {
			t.Errorf("Err before the deadline = %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the handler's context did not end at its deadline")
		}
		if time.Now().Before(d) {
			t.Errorf("context ended at %v, before its deadline %v", time.Now(), d)
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			t.Errorf("Err = %v, Cause = %v; want DeadlineExceeded", ctx.Err(), context.Cause(ctx))
		}
		w.WriteHeader(http.StatusCreated)
	})
	if !ran {
		t.Fatal("handler did not run")
	}
}

// TestHandlerContextEndsWithRequest: once the request is over, the
// handler's context is cancelled, whether or not the handler looked at it
// while it ran, and so is every context derived from it.
func TestHandlerContextEndsWithRequest(t *testing.T) {
	t.Parallel()
	for _, look := range []bool{false, true} {
		var kept, derived context.Context
		serveWith(t, context.Background(), time.Minute, func(w http.ResponseWriter, r *http.Request) {
			kept = r.Context()
			if look {
				select {
				case <-kept.Done():
					t.Error("context done while the handler runs")
				default:
				}
				var cancel context.CancelFunc
				derived, cancel = context.WithCancel(kept)
				t.Cleanup(cancel)
			}
			w.WriteHeader(http.StatusCreated)
		})
		for _, ctx := range []context.Context{kept, derived} {
			if ctx == nil {
				continue
			}
			select {
			case <-ctx.Done():
			default:
				t.Fatalf("look=%v: context not done after the request", look)
			}
			if !errors.Is(ctx.Err(), context.Canceled) {
				t.Fatalf("look=%v: Err = %v, want Canceled", look, ctx.Err())
			}
		}
	}
}

// TestHandlerContextOutlivesRequest: the handler's context does not end
// when the request's does (the client went away): the handler goes on, its
// answer is kept, and the client's retry gets it replayed rather than a
// second execution. The request's values stay in it.
func TestHandlerContextOutlivesRequest(t *testing.T) {
	t.Parallel()
	type valueKey struct{}
	ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), valueKey{}, "v"))
	defer cancel(nil)
	m := newMiddleware(t, idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil)})
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		cancel(errors.New("client went away"))
		if err := r.Context().Err(); err != nil {
			t.Errorf("the handler's context ended with the request's: %v (cause %v)", err, context.Cause(r.Context()))
		}
		if r.Context().Value(valueKey{}) != "v" {
			t.Error("the request's values are lost")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`)).WithContext(ctx)
	req.Header.Set(idemhttp.HeaderKey, "k")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if c := m.Counts()[idemhttp.OutcomeExecuted]; c != 1 {
		t.Fatalf("counts %v: want the answer kept", m.Counts())
	}
	retry := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
	retry.Header.Set(idemhttp.HeaderKey, "k")
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, retry)
	if rr.Code != http.StatusCreated || rr.Header().Get(idemhttp.HeaderReplayed) != "true" || runs != 1 {
		t.Fatalf("retry: %d, replayed %q, %d runs; want the kept answer replayed", rr.Code, rr.Header().Get(idemhttp.HeaderReplayed), runs)
	}
}
