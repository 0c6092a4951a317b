package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// A Scope that returns no scope and no error (a tenant header the request
// lacks) is refused 401 and runs nothing, unless SharedScope lets the
// empty scope through as the shared one.
func TestEmptyScopeRefused(t *testing.T) {
	t.Parallel()
	tenant := func(r *http.Request) (idem.Scope, error) { return idem.Scope(r.Header.Get("X-Tenant")), nil }
	for _, shared := range []bool{false, true} {
		store := idemmem.NewStore(nil)
		m, err := idemhttp.New(&idemhttp.Config{Store: store, Scope: tenant, SharedScope: shared})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.WriteHeader(http.StatusCreated)
		}))
		send := func(tenant string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
			req.Header.Set(idemhttp.HeaderKey, "k-1")
			if tenant != "" {
				req.Header.Set("X-Tenant", tenant)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		rec := send("")
		switch {
		case !shared && (rec.Code != http.StatusUnauthorized || runs != 0 || !strings.Contains(rec.Body.String(), idemhttp.ProblemScope)):
			t.Fatalf("no tenant: %d %s after %d runs; want 401 %s and nothing run", rec.Code, rec.Body, runs, idemhttp.ProblemScope)
		case shared && (rec.Code != http.StatusCreated || runs != 1):
			t.Fatalf("no tenant, SharedScope: %d after %d runs; want 201 in the shared scope", rec.Code, runs)
		}
		if _, err := store.Get(t.Context(), "", "k-1"); shared == (err != nil) {
			t.Fatalf("SharedScope %v: the shared scope's record: %v", shared, err)
		}
		if rec := send("acme"); rec.Code != http.StatusCreated {
			t.Fatalf("with a tenant: %d %s", rec.Code, rec.Body)
		}
	}
}

// The published policy lists the 401 an empty scope gets, when Scope can
// return one and SharedScope does not take it.
func TestPolicyListsEmptyScopeRefusal(t *testing.T) {
	t.Parallel()
	tenant := func(r *http.Request) (idem.Scope, error) { return "", nil }
	for _, shared := range []bool{false, true} {
		m, err := idemhttp.New(&idemhttp.Config{Store: idemmem.NewStore(nil), Scope: tenant, SharedScope: shared})
		if err != nil {
			t.Fatal(err)
		}
		listed := false
		for _, a := range m.Policy().Answers {
			listed = listed || a.Status == http.StatusUnauthorized
		}
		if listed == shared {
			t.Errorf("SharedScope %v: 401 listed %v", shared, listed)
		}
	}
}
