package consoletest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/keyed"
)

// cancellingActions are a completer's actions whose request is given up
// by its browser (the context cancelled) the moment a settle has ended the
// key.
type cancellingActions struct {
	*idemhttp.Completer
	cancel context.CancelFunc
}

func (a cancellingActions) SettleRecorded(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, record keyed.SettleRecord) (idem.Record, error) {
	rec, err := a.Completer.SettleRecorded(ctx, scope, key, answer, record)
	a.cancel()
	return rec, err
}

// A settle that ended the key is kept in its history even when the
// operator's browser gives up the request right after it: the history is
// written whatever became of the request, not only while it waits.
func TestSettleIsRecordedWhenTheRequestIsGivenUp(t *testing.T) {
	t.Parallel()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	comp := sw.completer(sw.store, "a", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		t.Error("a settle resumed the key")
		return nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, Actions: cancellingActions{Completer: comp, cancel: cancel}})

	form := url.Values{"scope": {string(settleScope)}, "key": {"pay-1"}, "action": {console.ActionSettleFailed},
		"reason": {"no charge at the network"}, "confirm": {"yes"}}
	hr := httptest.NewRequestWithContext(ctx, http.MethodPost, "/console/outcomes/act", strings.NewReader(form.Encode()))
	hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	hr.Header.Set("Authorization", "Bearer "+aliceToken)
	rr := httptest.NewRecorder()
	w.h.ServeHTTP(rr, hr)

	if rec := sw.record("pay-1"); rec.State != idem.StateCompleted {
		t.Fatalf("the key after the settle: %v", rec.State)
	}
	if rr.Code != http.StatusSeeOther {
		t.Fatalf("the settle: %d, want 303\n%s", rr.Code, rr.Body)
	}
	body := w.do(req{path: "/console/outcomes/key?key=pay-1&scope=acme", token: aliceToken}).Body.String()
	for _, want := range []string{"settle-failed", "no charge at the network", "settled (status 409)"} {
		if !strings.Contains(body, want) {
			t.Fatalf("the key's history lacks %q:\n%s", want, body)
		}
	}
}

// A reason longer than the confirmation form allows is refused by the
// server too, changing nothing: the form's maxlength is the browser's
// rule, not the service's.
func TestSettleRefusesAnOverlongReason(t *testing.T) {
	t.Parallel()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	comp := sw.completer(sw.store, "a", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		t.Error("a settle resumed the key")
		return nil
	})
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, Actions: comp})
	form := url.Values{"scope": {string(settleScope)}, "key": {"pay-1"}, "action": {console.ActionSettleFailed},
		"reason": {strings.Repeat("é", 501)}, "confirm": {"yes"}}
	rr := w.act(form)
	if rr.Code != http.StatusBadRequest || !strings.Contains(rr.Body.String(), "at most 500 characters") || !strings.Contains(rr.Body.String(), "Nothing was changed") {
		t.Fatalf("an overlong reason: %d\n%s", rr.Code, rr.Body)
	}
	if rec := sw.record("pay-1"); rec.State != idem.StateInFlight {
		t.Fatalf("the key after a refused settle: %v", rec.State)
	}
	form.Set("reason", strings.Repeat("é", 500))
	if rr := w.act(form); rr.Code != http.StatusSeeOther {
		t.Fatalf("a reason of 500 characters: %d\n%s", rr.Code, rr.Body)
	}
	if rec := sw.record("pay-1"); rec.State != idem.StateCompleted {
		t.Fatalf("the key after the settle: %v", rec.State)
	}
}
