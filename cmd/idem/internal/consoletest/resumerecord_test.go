package consoletest_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
)

func resumeForm(key string) url.Values {
	return url.Values{"scope": {string(settleScope)}, "key": {key}, "action": {console.ActionResume},
		"reason": {"the completer is down"}, "confirm": {"yes"}}
}

// answered is a Resume that finishes every key with 201, counting its
// runs.
func answered(runs *atomic.Int64) idemhttp.ResumeFunc {
	return func(_ context.Context, w http.ResponseWriter, _ idemhttp.Execution) error {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"id":"pay-1"}`))
		return err
	}
}

// A resume that finishes a key and its entry in the key's history commit
// in one transaction on SQLite and PostgreSQL: when the entry is written
// the key is not yet completed in anyone's eyes (a crash then leaves
// neither), and a history that fails leaves the key as it was, in flight
// at its point with its lease ended, with no entry; the resume taken
// again records both. A resume that finds nothing was done outside
// releases the key with its entry written first.
func TestResumeAndItsHistoryEntryCommitTogether(t *testing.T) {
	t.Parallel()
	onEveryDatabase(t, func(t *testing.T, sw *settleWorld) {
		var runs atomic.Int64
		h, rec := entryFailsThenTakenAgain(t, sw, "resume", resumeForm, "Not resumed", answered(&runs))
		if rec.Recovery.Name != "charging" {
			t.Fatalf("a resume whose history entry failed left the key at %q; want it at its point", rec.Recovery.Name)
		}
		if rec.LeaseExpiresAt.After(sw.clock.Now()) {
			t.Fatalf("a resume whose history entry failed left the key under a lease until %v (now %v); want it given back", rec.LeaseExpiresAt, sw.clock.Now())
		}
		evs := allEvents(t, h, "pay-1")
		if rec := sw.record("pay-1"); rec.State != idem.StateCompleted || rec.Response == nil || rec.Response.Status != http.StatusCreated ||
			len(evs) != 1 || evs[0].Result != "finished" || evs[0].Actor != "alice" {
			t.Fatalf("after the resume: the key %s, history %+v; want it completed with one entry", rec.State, evs)
		}
		if n := runs.Load(); n != 2 {
			t.Fatalf("Resume ran %d times; want 2", n)
		}

		// Released: nothing was done outside.
		sw.stop("pay-2")
		comp := sw.completer(sw.store, "b", func(context.Context, http.ResponseWriter, idemhttp.Execution) error { return idemhttp.ErrNothingDone })
		w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, Actions: comp, KeyHistory: h})
		if rr := w.act(resumeForm("pay-2")); rr.Code != http.StatusSeeOther {
			t.Fatalf("a resume that releases the key: %d\n%s", rr.Code, rr.Body)
		}
		if _, err := sw.store.Get(t.Context(), settleScope, "pay-2"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("pay-2 after a resume that found nothing done: %v; want it released", err)
		}
		evs = allEvents(t, h, "pay-2")
		if len(evs) != 2 || !strings.Contains(evs[1].Result, "under way") || !strings.Contains(evs[0].Result, "released") {
			t.Fatalf("pay-2's history: %+v; want the resume under way, then its release", evs)
		}
		if s := h.seen[len(h.seen)-2]; s != idem.StateInFlight {
			t.Fatalf("pay-2 was %s before its first entry was written; want in flight", s)
		}
	})
}

// On a store that shares no transaction with the history, a resume is
// recorded as under way before the key is completed, as a settle is,
// then with its result: a history that fails then leaves the key as it
// was; one that fails after leaves the entry saying the result is
// unknown, never a resumed key without one.
func TestResumeOnAStoreWithoutTransactionsRecordsItsIntentFirst(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	recordsItsIntentFirst(t, "resume", resumeForm, answered(&runs))
}

// answerLost is a real store whose CompleteTx commits, then loses its
// answer, as a connection reset after COMMIT leaves it.
type answerLost struct{ idem.Recoverer }

func (s answerLost) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	if _, err := s.Recoverer.(idem.TxStore).CompleteTx(ctx, ref, work); err != nil {
		return false, err
	}
	return false, errors.New("commit: connection reset by peer")
}

// A resume from the console whose commit got no answer
// (keyed.ErrResultUnknown) is neither called failed nor finished: the
// console sends the operator to the key's page with done=resume-unknown,
// which says the key may have been finished all the same, next to the
// key's state (here completed: the commit happened), and the history says
// "result unknown (resume)".
func TestResumeWhoseCommitGotNoAnswerSaysTheResultIsUnknown(t *testing.T) {
	t.Parallel()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	h := sw.keyHistory()
	var runs atomic.Int64
	comp := sw.completer(answerLost{sw.store}, "a", answered(&runs))
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: sw.store, Actions: comp, KeyHistory: h})

	rr := w.act(resumeForm("pay-1"))
	if rr.Code != http.StatusSeeOther || !strings.HasSuffix(rr.Header().Get("Location"), "&done=resume-unknown") {
		t.Fatalf("a resume whose commit got no answer: %d %q\n%s", rr.Code, rr.Header().Get("Location"), rr.Body)
	}
	page := w.do(req{path: rr.Header().Get("Location"), token: aliceToken})
	for _, want := range []string{"may have been finished all the same", "result unknown (resume)", "connection reset by peer"} {
		if page.Code != http.StatusOK || !strings.Contains(page.Body.String(), want) {
			t.Fatalf("the key's page after the unknown result: %d, lacks %q\n%s", page.Code, want, page.Body)
		}
	}
	if strings.Contains(page.Body.String(), "The resume failed") {
		t.Fatalf("the key's page calls the resume failed:\n%s", page.Body)
	}
	if rec := sw.record("pay-1"); rec.State != idem.StateCompleted {
		t.Fatalf("the key after a commit that happened: %s; want completed", rec.State)
	}
	evs := allEvents(t, h, "pay-1")
	if len(evs) == 0 || !strings.HasPrefix(evs[0].Result, "result unknown (resume): ") {
		t.Fatalf("the key's history: %+v; want its last entry saying the result is unknown", evs)
	}
}
