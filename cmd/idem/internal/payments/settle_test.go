package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// A second payment.succeeded event for a payment that already settled,
// under an event_id of its own (a producer that announced it twice, an
// event re-published by hand), gets past the inbox, which knows event IDs
// only; the payment's own settled mark keeps it from counting again. Both
// ways in are tried: straight onto the transport, and through the outbox.
func TestSecondEventOfAPaymentSettlesNothing(t *testing.T) {
	t.Parallel()
	databases := map[string]func(t *testing.T, c *Config){
		"sqlite": func(t *testing.T, c *Config) {
			db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "twice.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			c.DB = db
		},
		"postgres": func(t *testing.T, c *Config) { c.Postgres = OpenPostgresForTest(t, nil) },
	}
	for name, open := range databases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			cfg := &Config{APIKeys: map[string]string{"k": "acme"}, TransportPoll: 5 * time.Millisecond,
				RetryBase: time.Millisecond, RetryCap: time.Millisecond}
			open(t, cfg)
			svc, err := New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { svc.Close() })
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
			waitProcessed := func(n int64) {
				t.Helper()
				deadline := time.Now().Add(30 * time.Second)
				for svc.pipeline.consumer.Stats().Processed < n {
					if time.Now().After(deadline) {
						t.Fatalf("stats after 30s: %+v, want %d processed", svc.pipeline.consumer.Stats(), n)
					}
					time.Sleep(5 * time.Millisecond) // polling, with a deadline
				}
			}
			settlement := func() Settlement {
				t.Helper()
				var st Settlement
				if w := do("GET", "/v1/settlement", "", ""); w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &st) != nil {
					t.Fatalf("GET /v1/settlement: %d %s", w.Code, w.Body)
				}
				return st
			}

			acct := do("POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
			id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
			w := do("POST", "/v1/payments", "p-1", `{"account_id":"`+id+`","amount":30,"currency":"KRW"}`)
			var p Payment
			if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &p) != nil {
				t.Fatalf("payment: %d %s", w.Code, w.Body)
			}
			waitProcessed(1)
			want := Settlement{Currency: "KRW", Total: 30, Events: 1}
			if st := settlement(); st != want {
				t.Fatalf("settlement after the payment = %+v, want %+v", st, want)
			}

			again := func(eventID string) idem.Message {
				body, err := json.Marshal(PaymentEvent{EventID: eventID, Type: EventPaymentSucceeded, PaymentID: p.ID,
					Tenant: "acme", AccountID: id, Amount: 30, Currency: "KRW", OccurredAt: p.CreatedAt})
				if err != nil {
					t.Fatal(err)
				}
				return idem.Message{ID: eventID, Topic: TopicPaymentSucceeded, Key: id, Payload: body}
			}
			if err := svc.pipeline.transport.Publish(ctx, again("evt_second")); err != nil {
				t.Fatal(err)
			}
			waitProcessed(2)
			if err := svc.pipeline.msgs.inTx(ctx, func(ctx context.Context) error {
				return svc.pipeline.msgs.outbox.Add(ctx, again("evt_third"))
			}); err != nil {
				t.Fatal(err)
			}
			svc.pipeline.relay.Wake()
			waitProcessed(3)
			if st := settlement(); st != want {
				t.Errorf("settlement after two more events of the payment = %+v, want %+v: the payment counted more than once", st, want)
			}
			if s := svc.pipeline.consumer.Stats(); s.DeadLettered != 0 || s.Duplicates != 0 {
				t.Errorf("consumer stats %+v: the later events should be processed (their inbox rows kept), neither dead-lettered nor taken for redeliveries", s)
			}
		})
	}
}

// The storage settles a payment at most once, whatever its events' IDs:
// within one batch and across batches. An event that disagrees with its
// payment, settled or not, or names none, fails its batch, which then
// marks nothing settled.
func TestStorageSettlesEachPaymentOnce(t *testing.T) {
	t.Parallel()
	for name, open := range storagesForTest() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			ctx := context.Background()
			now := time.Now().UTC()
			a := Account{ID: newID("acct_"), Tenant: "t", Balance: 1_000, Currency: "KRW", CreatedAt: now}
			if err := st.CreateAccount(ctx, a); err != nil {
				t.Fatal(err)
			}
			pay := func(amount int64) Payment {
				t.Helper()
				p, err := st.CreatePayment(ctx, Payment{ID: newID("pay_"), Tenant: "t", AccountID: a.ID, Amount: amount,
					Currency: "KRW", Status: StatusSucceeded, CreatedAt: now}, origin{})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			ev := func(eventID string, p Payment) PaymentEvent {
				return PaymentEvent{EventID: eventID, Type: EventPaymentSucceeded, PaymentID: p.ID, Tenant: p.Tenant,
					AccountID: p.AccountID, Amount: p.Amount, Currency: p.Currency, OccurredAt: p.CreatedAt}
			}
			expect := func(want Settlement) {
				t.Helper()
				got, err := st.settlement(ctx, "t")
				if err != nil || got != want {
					t.Fatalf("settlement = %+v, %v; want %+v", got, err, want)
				}
			}
			settle := func(evs ...PaymentEvent) ([]int, error) { return st.settle(ctx, evs) }
			failsAt := func(index int, evs ...PaymentEvent) {
				t.Helper()
				_, err := settle(evs...)
				var ee *eventError
				if !errors.As(err, &ee) || ee.index != index || !idem.IsPermanent(err) {
					t.Fatalf("settle = %v; want a permanent error of event %d", err, index)
				}
			}

			p1, p2, p3 := pay(30), pay(12), pay(5)
			// Two events of p1 in one batch.
			already, err := settle(ev("e1", p1), ev("e2", p1), ev("e3", p2))
			if err != nil {
				t.Fatal(err)
			}
			expect(Settlement{Currency: "KRW", Total: 42, Events: 2})
			if len(already) != 1 || already[0] != 1 {
				t.Fatalf("settle reported %v; want event 1 reported as of a payment settled already", already)
			}
			// And one in a later batch.
			already, err = settle(ev("e4", p1))
			if err != nil {
				t.Fatal(err)
			}
			expect(Settlement{Currency: "KRW", Total: 42, Events: 2})
			if len(already) != 1 || already[0] != 0 {
				t.Fatalf("settle of a settled payment's event reported %v; want it reported", already)
			}

			// A settled payment's event is still checked against it.
			forged := ev("e5", p2)
			forged.Amount = 99
			failsAt(1, ev("e6", p3), forged)
			// An unknown payment fails its batch, and p3, in it, stays
			// unsettled: the batch without it settles it.
			failsAt(1, ev("e6", p3), ev("e7", Payment{ID: "pay_none", Tenant: "t", Amount: 1, Currency: "KRW"}))
			expect(Settlement{Currency: "KRW", Total: 42, Events: 2})
			if already, err := settle(ev("e6", p3)); err != nil || len(already) != 0 {
				t.Fatalf("settle = %v, %v", already, err)
			}
			expect(Settlement{Currency: "KRW", Total: 47, Events: 3})

			// Batches settling events of one payment at once (replicas
			// that each received one) add it once between them.
			p4 := pay(100)
			const n = 8
			results := make([][]int, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					results[i], errs[i] = settle(ev(fmt.Sprint("race-", i), p4), ev(fmt.Sprint("race-p3-", i), p3))
				})
			}
			close(start)
			wg.Wait()
			added := 0
			for i, err := range errs {
				if err != nil {
					t.Fatalf("concurrent batch %d: %v", i, err)
				}
				if !slices.Contains(results[i], 0) {
					added++
				}
			}
			if added != 1 {
				t.Errorf("%d of %d concurrent batches added the payment, want 1", added, n)
			}
			expect(Settlement{Currency: "KRW", Total: 147, Events: 4})
		})
	}
}
