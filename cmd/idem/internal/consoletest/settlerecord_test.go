package consoletest_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
)

// faultyHistory is a real history whose writes, once armed, fail, as a
// process that dies before it writes would leave them. Every write first
// looks at the key from outside any transaction: seen is what a crash
// at that moment would leave.
type faultyHistory struct {
	console.KeyHistory
	store idem.Recoverer
	// failAt is the number of the write (from 1) that fails; 0: none.
	failAt atomic.Int64
	writes atomic.Int64
	// seen is the key's state as others saw it at each write; 0 when it
	// was gone (released).
	seen []idem.State
}

func (h *faultyHistory) AddKeyEvent(ctx context.Context, ev console.KeyEvent) error {
	n := h.writes.Add(1)
	// A context without the settle's transaction: what is committed.
	rec, err := h.store.Get(context.WithoutCancel(context.Background()), ev.Scope, ev.Key)
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		return err
	}
	h.seen = append(h.seen, rec.State)
	if n == h.failAt.Load() {
		return errors.New("the history's database went away")
	}
	return h.KeyHistory.AddKeyEvent(ctx, ev)
}

// nonTxStore is a real store seen through idem.Recoverer alone, as a store
// that shares no transaction with the history (Redis) is.
type nonTxStore struct{ idem.Recoverer }

func settleForm(key string) url.Values {
	return url.Values{"scope": {string(settleScope)}, "key": {key}, "action": {console.ActionSettleFailed},
		"reason": {"no charge at the network"}, "confirm": {"yes"}}
}

func allEvents(t *testing.T, h console.KeyHistory, key idem.Key) []console.KeyEvent {
	t.Helper()
	evs, err := h.KeyEvents(t.Context(), settleScope, key, console.KeyEventsQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// entryFailsThenTakenAgain stops pay-1, takes action (its console form
// made by form) on it through the console of a completer running resume,
// whose history's first write fails, then takes it again. It checks what
// an action whose entry in the key's history commits with it shares,
// whatever the action: the key was in flight as each entry was written
// (so that a crash then leaves neither), and the failed action leaves the
// key in flight with no entry, its page saying notDone (a 500) and that
// nothing was changed; the action taken again is done (a 303). It returns
// the history and the key as the failed action left it.
func entryFailsThenTakenAgain(t *testing.T, sw *settleWorld, action string, form func(string) url.Values, notDone string, resume idemhttp.ResumeFunc) (*faultyHistory, idem.Record) {
	t.Helper()
	sw.stop("pay-1")
	h := &faultyHistory{KeyHistory: sw.keyHistory(), store: sw.store}
	h.failAt.Store(1)
	comp := sw.completer(sw.store, "a", resume)
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, Actions: comp, KeyHistory: h})

	rr := w.act(form("pay-1"))
	rec := sw.record("pay-1")
	evs := allEvents(t, h, "pay-1")
	if len(h.seen) == 0 || h.seen[0] != idem.StateInFlight {
		t.Fatalf("the key as the %s's history entry was written: %v; want in flight (a crash then leaves a %s with no entry)", action, h.seen, action)
	}
	if rec.State != idem.StateInFlight || len(evs) != 0 {
		t.Fatalf("a %s whose history entry failed: the key %s, %d entries (%+v); want it in flight with none", action, rec.State, len(evs), evs)
	}
	if rr.Code != http.StatusInternalServerError || !strings.Contains(rr.Body.String(), notDone) || !strings.Contains(rr.Body.String(), "Nothing was changed") {
		t.Fatalf("the failed %s's page: %d\n%s", action, rr.Code, rr.Body)
	}

	h.failAt.Store(0)
	if rr := w.act(form("pay-1")); rr.Code != http.StatusSeeOther {
		t.Fatalf("the %s taken again: %d\n%s", action, rr.Code, rr.Body)
	}
	if len(h.seen) < 2 || h.seen[1] != idem.StateInFlight {
		t.Fatalf("the key as the %s taken again wrote its history entry: %v; want in flight", action, h.seen)
	}
	return h, rec
}

// A settle and its entry in the key's history commit in one transaction
// on SQLite and PostgreSQL: when the entry is written the settle is not
// yet visible to anyone (a crash then leaves neither), and a history that
// fails leaves the key as it was, unsettled, with no entry; the settle
// taken again records both.
func TestSettleAndItsHistoryEntryCommitTogether(t *testing.T) {
	t.Parallel()
	onEveryDatabase(t, func(t *testing.T, sw *settleWorld) {
		h, _ := entryFailsThenTakenAgain(t, sw, "settle", settleForm, "Not settled", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
			t.Error("a settle resumed the key")
			return nil
		})
		evs := allEvents(t, h, "pay-1")
		if rec := sw.record("pay-1"); rec.State != idem.StateCompleted || len(evs) != 1 || evs[0].Result != "settled (status 409)" || evs[0].Actor != "alice" {
			t.Fatalf("after the settle: the key %s, history %+v; want it completed with one entry", rec.State, evs)
		}
	})
}

// On a store that shares no transaction with the history, the settle is
// recorded as under way before the key is completed, then with its
// result: a history that fails after the settle leaves the entry saying
// the result is unknown, never a settle without one; one that fails
// before it leaves the key unsettled.
func TestSettleOnAStoreWithoutTransactionsRecordsItsIntentFirst(t *testing.T) {
	t.Parallel()
	recordsItsIntentFirst(t, "settle", settleForm, func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		t.Error("a settle resumed the key")
		return nil
	})
}

// recordsItsIntentFirst takes an action (form, named what) on two keys of
// a store that shares no transaction with the history, whose completer
// resumes with resume: with the history failing at the entry saying the
// action is under way, the key is left as it was with no entry; failing
// at the entry of its result, the key is finished, and the entry saying
// the action was under way says its result is unknown.
func recordsItsIntentFirst(t *testing.T, what string, form func(key string) url.Values, resume idemhttp.ResumeFunc) {
	t.Helper()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	sw.stop("pay-2")
	store := nonTxStore{sw.store}
	h := &faultyHistory{KeyHistory: sw.keyHistory(), store: sw.store}
	comp := sw.completer(store, "a", resume)
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: store, Actions: comp, KeyHistory: h})

	h.failAt.Store(1)
	if rr := w.act(form("pay-1")); rr.Code != http.StatusInternalServerError {
		t.Fatalf("a %s whose first entry failed: %d\n%s", what, rr.Code, rr.Body)
	}
	if rec, evs := sw.record("pay-1"), allEvents(t, h, "pay-1"); rec.State != idem.StateInFlight || len(evs) != 0 {
		t.Fatalf("a %s whose first entry failed: the key %s, history %+v; want it in flight with none", what, rec.State, evs)
	}

	h.failAt.Store(h.writes.Load() + 2)
	rr := w.act(form("pay-2"))
	if rr.Code != http.StatusInternalServerError || !strings.Contains(rr.Body.String(), "Done, but not fully recorded") {
		t.Fatalf("a %s whose result could not be recorded: %d\n%s", what, rr.Code, rr.Body)
	}
	evs := allEvents(t, h, "pay-2")
	if rec := sw.record("pay-2"); rec.State != idem.StateCompleted || len(evs) != 1 || !strings.Contains(evs[0].Result, "under way") || !strings.Contains(evs[0].Result, "unknown") {
		t.Fatalf("after a %s whose result could not be recorded: the key %s, history %+v; want it completed with the entry saying it was under way", what, rec.State, evs)
	}
	if h.seen[len(h.seen)-2] != idem.StateInFlight || h.seen[len(h.seen)-1] != idem.StateCompleted {
		t.Fatalf("the key as the two entries saw it: %v; want in flight, then completed", h.seen)
	}
}

// A key's history is read a page at a time, newest first, on SQLite and
// PostgreSQL: however many entries a key has, a page holds at most its
// limit, the next page starts below the last one's entry, and another
// key's entries never show. The key's page shows the latest entries and
// links to older ones.
func TestKeyHistoryIsPaged(t *testing.T) {
	t.Parallel()
	onEveryDatabase(t, func(t *testing.T, sw *settleWorld) {
		h := sw.keyHistory()
		const n = 130
		for i := range n {
			for _, key := range []idem.Key{"pay-1", "pay-2"} {
				ev := console.KeyEvent{Scope: settleScope, Key: key, At: sw.clock.Now(), Actor: "alice", Action: console.ActionResume,
					Reason: fmt.Sprintf("try %d", i), Result: "failed: the network went away"}
				if err := h.AddKeyEvent(t.Context(), ev); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := h.KeyEvents(t.Context(), settleScope, "pay-1", console.KeyEventsQuery{Limit: console.MaxKeyEventsLimit + 1}); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Fatalf("a limit over the most: %v; want an argument error", err)
		}
		var reasons []string
		q := console.KeyEventsQuery{Limit: 50}
		for pages := 0; ; pages++ {
			evs, err := h.KeyEvents(t.Context(), settleScope, "pay-1", q)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) > q.Limit || pages > n/q.Limit+1 {
				t.Fatalf("page %d holds %d entries; limit %d", pages, len(evs), q.Limit)
			}
			if len(evs) == 0 {
				break
			}
			for _, ev := range evs {
				if ev.Key != "pay-1" || (q.Before != 0 && ev.ID >= q.Before) {
					t.Fatalf("page %d holds %+v (before %d)", pages, ev, q.Before)
				}
				reasons = append(reasons, ev.Reason)
			}
			q.Before = evs[len(evs)-1].ID
		}
		if len(reasons) != n {
			t.Fatalf("%d entries over the pages; want %d", len(reasons), n)
		}
		for i, r := range reasons {
			if want := fmt.Sprintf("try %d", n-1-i); r != want {
				t.Fatalf("entry %d over the pages: %q; want %q (newest first, none twice)", i, r, want)
			}
		}

		if sw.sqlite == nil {
			return
		}
		// The console's page of the key, once (on SQLite).
		w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, KeyHistory: h})
		body := w.do(req{path: "/console/outcomes/key?scope=acme&key=pay-1", token: aliceToken}).Body.String()
		if !strings.Contains(body, "try 129<") || !strings.Contains(body, "try 80<") || strings.Contains(body, "try 79<") || !strings.Contains(body, `id="history-older"`) {
			t.Fatalf("the key's page shows other than its 50 latest entries with a link to older ones:\n%s", body)
		}
		older := regexp.MustCompile(`id="history-older" href="([^"]+)"`).FindStringSubmatch(body)
		path, _, _ := strings.Cut(html.UnescapeString(older[1]), "#") // a browser sends no fragment
		body = w.do(req{path: path, token: aliceToken}).Body.String()
		if !strings.Contains(body, "try 79<") || !strings.Contains(body, "try 30<") || strings.Contains(body, "try 80<") || strings.Contains(body, "try 29<") || !strings.Contains(body, `id="history-latest"`) {
			t.Fatalf("the page of older entries:\n%s", body)
		}
	})
}

// A console given no completer (idem console, served apart from the
// service) says on a stopped key's page that it offers no actions and
// where they are, and refuses an action asked for all the same, saying
// the same and changing nothing.
func TestConsoleWithoutACompleterSaysWhereTheActionsAre(t *testing.T) {
	t.Parallel()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store})
	body := w.do(req{path: "/console/outcomes/key?scope=acme&key=pay-1", token: aliceToken}).Body.String()
	for _, want := range []string{"No actions here", "not given the service's completer", "idem keys resume", "idem keys settle"} {
		if !strings.Contains(body, want) {
			t.Fatalf("the stopped key's page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `id="act-resume"`) || strings.Contains(body, `id="act-settle-failed"`) {
		t.Fatalf("the page offers actions it cannot take:\n%s", body)
	}
	for _, r := range []req{
		{path: "/console/outcomes/act?scope=acme&key=pay-1&action=resume", token: aliceToken},
		{method: http.MethodPost, path: "/console/outcomes/act", form: settleForm("pay-1"), token: aliceToken},
	} {
		rr := w.do(r)
		if rr.Code != http.StatusNotFound || !strings.Contains(rr.Body.String(), "idem keys resume") || !strings.Contains(rr.Body.String(), "Nothing was changed") {
			t.Fatalf("%s %s without a completer: %d\n%s", r.method, r.path, rr.Code, rr.Body)
		}
	}
	if rec := sw.record("pay-1"); rec.State != idem.StateInFlight {
		t.Fatalf("the key after actions refused: %v", rec.State)
	}
}
