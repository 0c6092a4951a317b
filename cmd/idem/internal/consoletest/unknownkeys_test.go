package consoletest_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
)

// yieldRefused is a real store whose Yield fails, as one that went away
// between an action's claim of a key and its give-back does.
type yieldRefused struct{ idem.Recoverer }

func (yieldRefused) Yield(context.Context, idem.Ref) error {
	return errors.New("the store went away")
}

// A settle whose entry in the key's history failed, and then its give-back
// (a Yield), leaves the completer holding the key under the settle's
// lease, still live, with no failed resume: the store's Abandoned does not
// list the key until that lease ends. The page of stopped executions must
// list it all the same (the completer's UnknownKeys names it), and its
// page must offer the actions that act on it under the completer's hold,
// not say that a live execution holds it.
func TestOutcomesListAKeyHeldAfterAFailedGiveBack(t *testing.T) {
	t.Parallel()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	h := &faultyHistory{KeyHistory: sw.keyHistory(), store: sw.store}
	h.failAt.Store(1)
	comp := sw.completer(yieldRefused{sw.store}, "a", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		t.Error("a settle resumed the key")
		return nil
	})
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, Actions: comp, KeyHistory: h})

	if rr := w.act(settleForm("pay-1")); rr.Code != http.StatusInternalServerError || !strings.Contains(rr.Body.String(), "Not settled") {
		t.Fatalf("a settle whose history entry and give-back failed: %d\n%s", rr.Code, rr.Body)
	}
	if rec := sw.record("pay-1"); rec.State != idem.StateInFlight || !rec.LeaseExpiresAt.After(sw.clock.Now()) {
		t.Fatalf("pay-1 after the settle: %s, lease until %s (now %s); want in flight under the settle's live lease", rec.State, rec.LeaseExpiresAt, sw.clock.Now())
	}
	if f := comp.Failures(settleScope, "pay-1"); !f.Holding || f.Count != 0 {
		t.Fatalf("the completer after the settle: %+v; want it holding the key, no failed resume", f)
	}
	abandoned, err := sw.store.Abandoned(t.Context(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range abandoned {
		if rec.Key == "pay-1" {
			t.Fatalf("Abandoned lists pay-1 under a live lease; the test needs the key listed by the completer alone")
		}
	}

	list := w.do(req{path: "/console/outcomes", token: aliceToken})
	if list.Code != http.StatusOK || !strings.Contains(list.Body.String(), "pay-1") || strings.Contains(list.Body.String(), "No execution is stopped") {
		t.Fatalf("the stopped executions with pay-1 held by the completer after a failed give-back: %d; want pay-1 listed\n%s", list.Code, list.Body)
	}
	page := w.do(req{path: "/console/outcomes/key?" + url.Values{"scope": {string(settleScope)}, "key": {"pay-1"}}.Encode(), token: aliceToken})
	if body := page.Body.String(); page.Code != http.StatusOK || strings.Contains(body, "A live execution holds the key") || !strings.Contains(body, console.ActionSettleFailed) {
		t.Fatalf("pay-1's page: %d; want the actions offered, not a live execution's hold\n%s", page.Code, body)
	}
}
