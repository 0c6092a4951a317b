package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

func TestFailTimes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		n    int
		want bool
	}{
		{"", 0, false},
		{"fail-times=3", 3, true},
		{" delay=1s , fail-times = 0", 0, true},
		{"fail-times=x", 0, false},
		{"fail-times=-1", 0, false},
		{"fail-before-commit", 0, false},
	}
	for _, tt := range tests {
		n, ok := failTimes(tt.in)
		if n != tt.n || ok != tt.want {
			t.Errorf("failTimes(%q) = %d, %v; want %d, %v", tt.in, n, ok, tt.n, tt.want)
		}
	}
}

func TestHasFault(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want bool
	}{
		{"crash-after-settle", true},
		{"fail-times=2, crash-after-settle ", true},
		{"crash-after-settlement", false},
		{"", false},
	} {
		if got := hasFault(tt.in, faultCrashAfterSettle); got != tt.want {
			t.Errorf("hasFault(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// crash-after-settle fires once the inbox row and the handler's writes
// committed, never when the attempt failed or was a duplicate.
func TestCrashingInbox(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "x.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	inner, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	crashes := 0
	in := &crashingInbox{Inbox: inner, crash: func() { crashes++ }}
	arm := func(ctx context.Context) error { armCrash(ctx); return nil }

	if err := in.Process(ctx, "c", "failing", func(ctx context.Context) error { armCrash(ctx); return idem.Permanent(context.Canceled) }); err == nil {
		t.Fatal("a failing attempt succeeded")
	}
	if crashes != 0 {
		t.Fatal("crashed after a failed attempt, which committed nothing")
	}
	if err := in.Process(ctx, "c", "k", func(context.Context) error { return nil }); err != nil || crashes != 0 {
		t.Fatalf("unarmed attempt: %v, %d crashes; want nil, 0", err, crashes)
	}
	if err := in.Process(ctx, "c", "k2", arm); err != nil || crashes != 1 {
		t.Fatalf("armed attempt: %v, %d crashes; want nil, 1", err, crashes)
	}
	if err := in.Process(ctx, "c", "k2", arm); err == nil || crashes != 1 {
		t.Fatalf("its redelivery: %v, %d crashes; want idem.ErrDuplicate, still 1", err, crashes)
	}
}

func TestEventDedupKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		payload   string
		key       string
		permanent bool
	}{
		{`{"event_id":"evt_1","amount":3}`, "evt_1", false},
		{`{"amount":3}`, "", true},
		{`{`, "", true},
		{``, "", true},
	}
	for _, tt := range tests {
		key, err := eventDedupKey(idem.Message{ID: "transport-id", Payload: []byte(tt.payload)})
		if key != tt.key || idem.IsPermanent(err) != tt.permanent || (err != nil) != tt.permanent {
			t.Errorf("eventDedupKey(%q) = %q, %v; want %q, permanent %v", tt.payload, key, err, tt.key, tt.permanent)
		}
	}
}

func TestPaymentEvent(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := Payment{ID: "pay_1", Tenant: "acme", AccountID: "acct_1", Amount: 12, Currency: "KRW", CreatedAt: at}
	a, err := paymentEvent(p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := paymentEvent(p)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID {
		t.Errorf("two events share the ID %q", a.ID)
	}
	var ev map[string]any
	if err := json.Unmarshal(a.Payload, &ev); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"event_id": a.ID, "type": "payment.succeeded", "payment_id": "pay_1", "tenant": "acme",
		"account_id": "acct_1", "amount": float64(12), "currency": "KRW", "occurred_at": "2026-01-02T03:04:05Z"}
	for k, v := range want {
		if ev[k] != v {
			t.Errorf("event %s = %v, want %v", k, ev[k], v)
		}
	}
	if len(ev) != len(want) {
		t.Errorf("event has fields %v, want exactly %v", ev, want)
	}
	if a.Topic != TopicPaymentSucceeded || a.Key != "acct_1" {
		t.Errorf("message topic %q key %q, want %q and the account", a.Topic, a.Key, TopicPaymentSucceeded)
	}
}

// An event for a payment that does not exist is dead-lettered at once; the
// service's real payment settles; an event rolled back with its payment
// (fail-before-commit) is never published.
func TestSettlementOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "settle.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	svc, err := New(ctx, &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, Faults: true,
		RetryBase: time.Millisecond, RetryCap: time.Millisecond, TransportPoll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	h := svc.Handler()
	do := func(method, path, key, body string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	acct := do("POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	if w := do("POST", "/v1/payments", "p-1", `{"account_id":"`+id+`","amount":30,"currency":"KRW"}`); w.Code != http.StatusCreated {
		t.Fatalf("payment: %d %s", w.Code, w.Body)
	}
	if w := do("POST", "/v1/payments", "p-2", `{"account_id":"`+id+`","amount":5,"currency":"KRW"}`, HeaderFault, "fail-before-commit"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("failed payment: %d %s", w.Code, w.Body)
	}
	ghost, _ := json.Marshal(PaymentEvent{EventID: "evt_ghost", Type: EventPaymentSucceeded, PaymentID: "pay_none", Tenant: "acme", AccountID: id, Amount: 1, Currency: "KRW"})
	if err := svc.pipeline.transport.Publish(ctx, idem.Message{ID: "evt_ghost", Topic: TopicPaymentSucceeded, Key: "other", Payload: ghost}); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		s := svc.pipeline.consumer.Stats()
		if s.Processed >= 1 && s.DeadLettered >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats after 30s: %+v", s)
		}
		time.Sleep(5 * time.Millisecond) // polling, with a deadline
	}
	var st Settlement
	if w := do("GET", "/v1/settlement", "", ""); w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &st) != nil {
		t.Fatalf("GET /v1/settlement: %d %s", w.Code, w.Body)
	}
	if st != (Settlement{Currency: "KRW", Total: 30, Events: 1}) {
		t.Errorf("settlement = %+v, want 30 KRW over 1 event", st)
	}
	dls, err := svc.pipeline.msgs.letters.List(ctx, idem.DeadLetterFilter{Consumer: SettlementConsumer})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Message.ID != "evt_ghost" || dls[0].Class != idem.DeadPermanent || len(dls[0].Attempts) != 1 {
		t.Errorf("dead letters = %+v, want the ghost event, permanent, after one attempt", dls)
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	// One event published: the failed payment's rolled back with it.
	var published int
	if err := db.Reader().QueryRowContext(context.Background(),
		`SELECT count(*) FROM idem_transport_messages WHERE id != 'evt_ghost'`).Scan(&published); err != nil || published != 1 {
		t.Errorf("events published: %d, %v; want 1", published, err)
	}
}

// TestPurgeOldMessages: once past the retention horizon, settled messages
// and the inbox rows that absorbed their duplicates are deleted; nothing
// younger is.
func TestPurgeOldMessages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "purge.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	svc, err := New(ctx, &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, TransportPoll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	count := func(table string) int {
		t.Helper()
		var n int
		if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	h := svc.Handler()
	do := func(method, path, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	acct := do("POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	for _, k := range []string{"p-1", "p-2", "p-3"} {
		if w := do("POST", "/v1/payments", k, `{"account_id":"`+id+`","amount":1,"currency":"KRW"}`); w.Code != http.StatusCreated {
			t.Fatalf("payment: %d %s", w.Code, w.Body)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for svc.pipeline.consumer.Stats().Processed < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("stats after 30s: %+v", svc.pipeline.consumer.Stats())
		}
		time.Sleep(5 * time.Millisecond) // polling, with a deadline
	}
	if count("idem_transport_messages") != 3 || count("idem_inbox") != 3 {
		t.Fatalf("before purging: %d messages, %d inbox rows", count("idem_transport_messages"), count("idem_inbox"))
	}
	// Nothing is older than an hour ago.
	if in, msgs, err := svc.pipeline.purgeOld(ctx, time.Now().Add(-time.Hour), 2); err != nil || in+msgs != 0 {
		t.Fatalf("purge with a past horizon: %d inbox rows, %d messages, %v", in, msgs, err)
	}
	// Everything settled is older than an hour from now; batches of 2.
	in, msgs, err := svc.pipeline.purgeOld(ctx, time.Now().Add(time.Hour), 2)
	if err != nil || in != 3 || msgs != 3 {
		t.Fatalf("purge: %d inbox rows, %d messages, %v; want 3 and 3", in, msgs, err)
	}
	if count("idem_transport_messages") != 0 || count("idem_inbox") != 0 {
		t.Fatalf("after purging: %d messages, %d inbox rows", count("idem_transport_messages"), count("idem_inbox"))
	}
	if _, err := New(ctx, &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, MessageRetention: -time.Second}); err == nil {
		t.Fatal("a negative MessageRetention was accepted")
	}
}

// A service with RequestsOnly writes its payments' events to the outbox
// and leaves them there; a service with workers on the same database
// relays and settles them.
func TestRequestsOnlyLeavesEventsToWorkers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "split.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	keys := map[string]string{"k": "acme"}
	api, err := New(ctx, &Config{DB: db, APIKeys: keys, RequestsOnly: true, TransportPoll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	do := func(h http.Handler, method, path, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	acct := do(api.Handler(), "POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	for i, amount := range []int{30, 12} {
		if w := do(api.Handler(), "POST", "/v1/payments", fmt.Sprint("p-", i), fmt.Sprintf(`{"account_id":%q,"amount":%d,"currency":"KRW"}`, id, amount)); w.Code != http.StatusCreated {
			t.Fatalf("payment %d: %d %s", i, w.Code, w.Body)
		}
	}
	pending := func() int {
		var n int
		if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := pending(); n != 2 {
		t.Fatalf("%d events in the outbox of a requests-only service, want both payments'", n)
	}
	if s := api.pipeline.consumer.Stats(); s.Processed != 0 {
		t.Fatalf("a requests-only service settled: %+v", s)
	}

	workers, err := New(ctx, &Config{DB: db, APIKeys: keys, TransportPoll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer workers.Close()
	idemtest.Eventually(t, 30*time.Second, "the workers settled both payments", func() bool {
		return workers.pipeline.consumer.Stats().Processed >= 2
	})
	var st Settlement
	if w := do(api.Handler(), "GET", "/v1/settlement", "", ""); w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &st) != nil {
		t.Fatalf("GET /v1/settlement: %d %s", w.Code, w.Body)
	}
	if st != (Settlement{Currency: "KRW", Total: 42, Events: 2}) {
		t.Errorf("settlement = %+v, want 42 KRW over 2 events", st)
	}
}
