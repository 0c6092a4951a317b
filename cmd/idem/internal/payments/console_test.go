package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// insightsBackend is one database a Service runs on, with the message
// stores the test writes through as the consumer would.
type insightsBackend struct {
	insights console.Insights
	letters  idem.DeadLetters
	ledger   idem.Ledger
	inbox    idem.Inbox
}

func TestConsoleInsightsSQLite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "payments.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := insightsBackend{}
	svc, err := payments.New(ctx, &payments.Config{DB: db, APIKeys: map[string]string{"k": "acme"}, RequestsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	must(t, func() (err error) { b.insights, err = payments.ConsoleInsights(db); return })
	must(t, func() (err error) { b.letters, err = idemsqlite.NewDeadLetters(ctx, db, nil); return })
	must(t, func() (err error) { b.ledger, err = idemsqlite.NewLedger(ctx, db); return })
	must(t, func() (err error) { b.inbox, err = idemsqlite.NewInbox(ctx, db); return })
	testInsights(t, svc, b)
}

func TestConsoleInsightsPostgres(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := payments.OpenPostgresForTest(t, nil)
	b := insightsBackend{}
	svc, err := payments.New(ctx, &payments.Config{Postgres: db, APIKeys: map[string]string{"k": "acme"}, RequestsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	must(t, func() (err error) { b.insights, err = payments.ConsoleInsightsPostgres(db); return })
	must(t, func() (err error) { b.letters, err = idempg.NewDeadLetters(ctx, db, nil); return })
	must(t, func() (err error) { b.ledger, err = idempg.NewLedger(ctx, db); return })
	must(t, func() (err error) { b.inbox, err = idempg.NewInbox(ctx, db); return })
	testInsights(t, svc, b)
}

func must(t *testing.T, fn func() error) {
	t.Helper()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
}

func testInsights(t *testing.T, svc *payments.Service, b insightsBackend) {
	ctx := t.Context()
	start := time.Now()
	post := func(path, body string) map[string]any {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "key-"+path)
		w := httptest.NewRecorder()
		svc.Handler().ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", path, w.Code, w.Body)
		}
		var out map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	acct := post("/v1/accounts", `{"balance":10000,"currency":"KRW"}`)["id"].(string)
	post("/v1/payments", `{"account_id":"`+acct+`","amount":1200,"currency":"KRW"}`)

	// Nothing settled yet (no relay runs): one event in the outbox, one
	// payment waiting to be settled.
	ov, err := b.insights.Overview(ctx, start.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(ov.Backlogs) != 2 || ov.Backlogs[0].Name != "outbox" || ov.Backlogs[0].Count != 1 || ov.Backlogs[0].Oldest.Before(start.Add(-time.Second)) ||
		ov.Backlogs[1].Name != "settlement" || ov.Backlogs[1].Count != 1 || ov.Backlogs[1].Oldest.IsZero() {
		t.Errorf("backlogs = %+v, want one event in the outbox and one payment unsettled, made since the test began", ov.Backlogs)
	}
	if len(ov.Consumers) != 0 {
		t.Errorf("consumers = %+v, want none before any message", ov.Consumers)
	}

	// A letter holding its key back with one message parked behind it, an
	// event processed, a message failing.
	c := payments.SettlementConsumer
	now := time.Now()
	id, err := b.letters.Add(ctx, idem.DeadLetter{
		Consumer: c, Class: idem.DeadPermanent,
		Message:       idem.Message{ID: "evt-bad", Topic: payments.TopicPaymentSucceeded, Key: acct, Payload: []byte(`{"event_id":"evt-bad"}`)},
		Attempts:      []idem.Attempt{{Number: 1, At: now, Class: idem.ClassPermanent, Error: "bad"}},
		FirstFailedAt: now, LastFailedAt: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	must(t, func() error { return b.ledger.HoldBack(ctx, c, acct, id) })
	must(t, func() error {
		return b.ledger.Park(ctx, c, idem.Message{ID: "evt-later", Topic: payments.TopicPaymentSucceeded, Key: acct, Payload: []byte(`{}`)})
	})
	must(t, func() error { return b.inbox.Process(ctx, c, "evt-done", func(context.Context) error { return nil }) })
	must(t, func() error {
		_, err := b.ledger.RecordAttempt(ctx, c, "evt-flaky", idem.Attempt{Number: 1, At: now, Class: idem.ClassTransient, Error: "timeout"})
		return err
	})

	parked, err := b.insights.ParkedCounts(ctx)
	if err != nil || len(parked) != 1 || parked[id] != 1 {
		t.Errorf("ParkedCounts = %v, %v; want 1 behind %s", parked, err, id)
	}
	for _, tc := range []struct {
		consumer, payload string
		want              bool
	}{
		{c, `{"event_id":"evt-done"}`, true},
		{c, `{"event_id":"evt-other"}`, false},
		{c, `{not json`, false},
		{"another-consumer", `{"event_id":"evt-done"}`, false},
	} {
		at, ok, err := b.insights.Processed(ctx, tc.consumer, idem.Message{ID: "x", Payload: []byte(tc.payload)})
		if err != nil || ok != tc.want || (ok && at.Before(start.Add(-time.Second))) {
			t.Errorf("Processed(%s, %s) = %v, %v, %v; want %v", tc.consumer, tc.payload, at, ok, err, tc.want)
		}
	}
	ov, err = b.insights.Overview(ctx, start.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := console.ConsumerOutcomes{Consumer: c, Processed: 1, Failing: 1, DeadLettered: 1}
	if len(ov.Consumers) != 1 || ov.Consumers[0] != want {
		t.Errorf("consumers = %+v, want %+v", ov.Consumers, want)
	}
	// Outside the window, nothing counts.
	if ov, err := b.insights.Overview(ctx, time.Now().Add(time.Minute)); err != nil || len(ov.Consumers) != 0 {
		t.Errorf("consumers of a window after everything = %+v, %v; want none", ov.Consumers, err)
	}
}
