package consoletest_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemmem"
)

// rollingBackStore is a real SQLite store whose CompleteTx, once armed,
// runs its work and then finds the lease lost, rolling everything back,
// as a takeover between the work and the commit would.
type rollingBackStore struct {
	idem.Recoverer
	armed atomic.Bool
}

func (s *rollingBackStore) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	ts := s.Recoverer.(idem.TxStore)
	if !s.armed.Load() {
		return ts.CompleteTx(ctx, ref, work)
	}
	return ts.CompleteTx(ctx, ref, func(txctx context.Context) (idem.Response, bool, error) {
		if _, _, err := work(txctx); err != nil {
			return idem.Response{}, false, err
		}
		return idem.Response{}, false, idem.ErrLeaseLost
	})
}

// The memory history keeps no transaction: used with a store that has
// one (SQLite), a settle or a resume whose transaction rolls back after
// its entry was written must not leave an entry saying it took effect.
// It records the action as under way first, then how it ended.
func TestMemoryHistoryWithATransactionalStore(t *testing.T) {
	t.Parallel()
	sw := sqliteSettleWorld(t)
	sw.stop("pay-1")
	sw.stop("pay-2")
	store := &rollingBackStore{Recoverer: sw.store}
	h := console.NewMemoryKeyHistory()
	var runs atomic.Int64
	comp := sw.completer(store, "a", answered(&runs))
	w := newWorld(t, &console.Config{Clock: sw.clock, Recoveries: store, Actions: comp, KeyHistory: h})

	store.armed.Store(true)
	for _, tc := range []struct {
		key  idem.Key
		form func(string) url.Values
	}{{"pay-1", settleForm}, {"pay-2", resumeForm}} {
		w.act(tc.form(string(tc.key)))
		rec := sw.record(tc.key)
		evs := allEvents(t, h, tc.key)
		if rec.State != idem.StateInFlight {
			t.Fatalf("%s after a rolled back action: %s; want in flight", tc.key, rec.State)
		}
		for _, ev := range evs {
			if strings.HasPrefix(ev.Result, "settled") || ev.Result == "finished" {
				t.Fatalf("%s's history says %q, but the key was rolled back, in flight: %+v", tc.key, ev.Result, evs)
			}
		}
		if len(evs) != 2 || !strings.Contains(evs[1].Result, "under way") {
			t.Fatalf("%s's history: %+v; want the action under way, then how it ended", tc.key, evs)
		}
	}

	// Not rolled back: the action under way, then its result.
	store.armed.Store(false)
	sw.clock.(*idemmem.Clock).Advance(20 * time.Second) // past the leases the rolled back actions took
	for _, tc := range []struct {
		key    idem.Key
		form   func(string) url.Values
		result string
	}{{"pay-1", settleForm, "settled (status 409)"}, {"pay-2", resumeForm, "finished"}} {
		if rr := w.act(tc.form(string(tc.key))); rr.Code != http.StatusSeeOther {
			t.Fatalf("%s: %d\n%s", tc.key, rr.Code, rr.Body)
		}
		evs := allEvents(t, h, tc.key)
		if rec := sw.record(tc.key); rec.State != idem.StateCompleted || len(evs) != 4 || evs[0].Result != tc.result || !strings.Contains(evs[1].Result, "under way") {
			t.Fatalf("%s after the action: %s, history %+v; want completed, the action under way then %q", tc.key, rec.State, evs, tc.result)
		}
	}
}
