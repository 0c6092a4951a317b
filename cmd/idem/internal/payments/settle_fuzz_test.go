package payments

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemsqlite"
)

// FuzzSettle hands the settlement consumer's batch handler whatever bytes
// a broker could deliver as a payment event, with whatever fault header,
// next to one genuine event, against a real SQLite database holding one
// payment of 30. Whatever comes in, it never panics, a failure names the
// message it is about (a consumer.ItemError), a malformed event is a
// permanent failure, and the payment adds 30 to the settlement once at
// most, whatever the batch held.
func FuzzSettle(f *testing.F) {
	dir := f.TempDir()
	db, err := idemsqlite.Open(filepath.Join(dir, "fuzz.db"), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	svc, err := New(context.Background(), &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, Faults: true, RequestsOnly: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { svc.Close() })
	h := svc.Handler()
	acct := serveJSON(h, "POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	pay := serveJSON(h, "POST", "/v1/payments", "fuzz-pay", `{"account_id":"`+id+`","amount":30,"currency":"KRW"}`)
	var p Payment
	if err := json.Unmarshal(pay.Body.Bytes(), &p); err != nil || p.ID == "" {
		f.Fatalf("payment: %d %s", pay.Code, pay.Body)
	}
	genuine, err := json.Marshal(PaymentEvent{EventID: "evt-genuine", Type: EventPaymentSucceeded, PaymentID: p.ID, Tenant: "acme",
		AccountID: id, Amount: 30, Currency: "KRW", OccurredAt: time.Now().UTC()})
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []struct{ payload, fault string }{
		{string(genuine), ""},
		{"{not json", ""},
		{`{"event_id":"e","payment_id":"` + p.ID + `","tenant":"acme","amount":1000000}`, ""},
		{`{"event_id":"e","payment_id":"pay_missing","tenant":"acme"}`, ""},
		{`{"event_id":"","payment_id":"` + p.ID + `","tenant":"acme"}`, "fail-times=2"},
		{`[1,2,3]`, "crash-after-settle;fail-times=x"},
		{`{"event_id":"e","payment_id":"` + p.ID + `","tenant":"other","amount":30,"currency":"KRW"}`, "fail-times=99999999999999999999"},
	} {
		f.Add([]byte(seed.payload), seed.fault)
	}
	f.Fuzz(func(t *testing.T, payload []byte, fault string) {
		if strings.Contains(fault, faultCrashAfterSettle) {
			t.Skip("crash-after-settle ends the process by design")
		}
		msgs := []idem.Message{
			{ID: "fuzzed", Topic: TopicPaymentSucceeded, Payload: payload, Headers: map[string]string{HeaderFault: fault}},
			{ID: "evt-genuine", Topic: TopicPaymentSucceeded, Payload: genuine},
		}
		// No batch information: fault headers are parsed, and a
		// fail-times fault fails nothing.
		err := svc.pipeline.settle(context.Background(), msgs)
		var ie *consumer.ItemError
		if err != nil && !errors.As(err, &ie) {
			t.Fatalf("settle failed without naming the message: %v", err)
		}
		if ie != nil && ie.Index == 1 {
			t.Fatalf("the genuine event was blamed: %v", err)
		}
		var ev PaymentEvent
		if json.Unmarshal(payload, &ev) != nil && err == nil {
			t.Fatalf("a malformed event was settled: %q", payload)
		}
		if json.Unmarshal(payload, &ev) != nil && !idem.IsPermanent(err) {
			t.Fatalf("a malformed event failed transiently: %v", err)
		}
		st, serr := svc.store.settlement(context.Background(), "acme")
		if serr != nil {
			t.Fatal(serr)
		}
		if st.Total != 0 && st.Total != 30 {
			t.Fatalf("settlement %+v: the one payment of 30 added %d", st, st.Total)
		}
	})
}
