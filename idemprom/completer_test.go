package idemprom_test

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
	"github.com/idem-go/idem/idemprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An execution that dies after its recovery point, and a completer that
// cannot learn its outcome: the collector shows one unknown outcome, how
// long it has been unknown, and the failed resume.
func TestCompleterCollector(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(&idemmem.Config{Clock: clock}),
		Lease: 10 * time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := idemhttp.SaveRecovery(r.Context(), "charging", nil); err != nil {
			t.Error(err)
		}
		panic(http.ErrAbortHandler) // the process dies after the point
	}))
	func() {
		defer func() { recover() }()
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.HeaderKey, "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	c, err := m.NewCompleter(&idemhttp.CompleterConfig{Resume: func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		return errors.New("the card network does not answer")
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(idemprom.NewCompleterCollector("payments", c))
	clock.Advance(11 * time.Second)
	if _, err := c.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(90 * time.Second)
	want := `
# HELP idem_http_recovery_unknown Keys in flight with a recovery point whose outcome the completer could not learn yet; never released.
# TYPE idem_http_recovery_unknown gauge
idem_http_recovery_unknown{middleware="payments"} 1
# HELP idem_http_recovery_oldest_unknown_seconds Seconds since the oldest unknown outcome's first failed resume; 0 when there is none.
# TYPE idem_http_recovery_oldest_unknown_seconds gauge
idem_http_recovery_oldest_unknown_seconds{middleware="payments"} 90
# HELP idem_http_recovered_total Abandoned executions the completer ended, by result: completed (answer kept) or released (nothing was done).
# TYPE idem_http_recovered_total counter
idem_http_recovered_total{middleware="payments",result="completed"} 0
idem_http_recovered_total{middleware="payments",result="released"} 0
# HELP idem_http_recovery_failures_total Resumes of abandoned executions that failed, leaving the outcome unknown until the next try.
# TYPE idem_http_recovery_failures_total counter
idem_http_recovery_failures_total{middleware="payments"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
